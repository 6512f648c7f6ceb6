"""Mixture-of-experts without host synchronisation: routing, then the chosen experts run grouped on the device.

The reference MoE (model/decoder.py) copies per-expert token counts to the host and loops over experts in
Python. Here the counts never leave the device, so the whole layer can be captured in a CUDA graph:

* `grouped`: (token, slot) pairs sorted by expert on the device, group ends found by `searchsorted`, and both
  SwiGLU projections run as ONE grouped GEMM each (`torch._grouped_mm`, bf16 CUTLASS kernels on Hopper; experts
  that received no rows are skipped, so each touched expert's weights are read once). Prefill and batched decode.
* `gather`: each (token, slot) row multiplies its expert's weights directly (gathered by id). Under
  torch.compile the gather is fused into the GEMV reduction (formulation `reduce`: no copy of the weights), so a
  batch-1 decode step reads exactly the 6 (+ shared) experts once, with no sort. Eagerly (`bmm`) the chosen
  weights are copied first; that is only the fallback.

Both return per-slot outputs [T, K, H] in the model dtype (each expert output rounded as the reference rounds
it), combined in float32 with the routing weights in a fixed slot order, like the reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")


def route(h: torch.Tensor, gate32: torch.Tensor, k: int, norm_topk_prob: bool, scale: float,
          gemv: str = "linear") -> tuple[torch.Tensor, torch.Tensor]:
    """h [T, H] -> routing weights [T, k] float32 and expert ids [T, k]: fp32 logits, fp32 softmax, greedy
    top-k, optional renormalisation, times the scale (the reference router's ops)."""
    if gemv == "reduce":  # a reduction Inductor fuses with its neighbours; same math
        logits = (h.float()[:, None, :] * gate32[None]).sum(-1)
    else:
        logits = h.float() @ gate32.t()
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(scores, k, dim=-1)
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


def experts_grouped(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                    inner: int) -> torch.Tensor:
    """x [T, H], ids [T, K] -> per-slot outputs [T, K, H]: rows sorted by expert, two grouped GEMMs, rows put
    back in (token, slot) order. No host sync: group ends come from searchsorted on the device."""
    if not HAS_GROUPED_MM:  # pragma: no cover - torch without grouped GEMM
        return experts_gather(x, ids, w13, w2, inner, "bmm")
    t, k = ids.shape
    flat = ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)  # (token, slot) pairs grouped by expert
    ends = torch.searchsorted(sorted_ids, torch.arange(w13.shape[0], device=ids.device, dtype=sorted_ids.dtype),
                              right=True, out_int32=True)  # end row of each expert's group
    xs = x.index_select(0, order // k)  # [T*K, H] rows in expert order
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends)  # [T*K, 2Im]; b is column-major per group
    a = swiglu(h, inner)
    ys = torch._grouped_mm(a, w2.transpose(1, 2), offs=ends)  # [T*K, H]
    return torch.empty_like(ys).index_copy_(0, order, ys).view(t, k, -1)


def combine(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-slot outputs [T, K, H] and weights [T, K] -> float32 weighted sum over slots, in the model dtype."""
    return (y.float() * weights.unsqueeze(-1)).sum(dim=1).to(y.dtype)


def moe_forward(h: torch.Tensor, gate32: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *, k: int,
                n_routed: int, shared_slots: int, inner: int, norm_topk_prob: bool, scale: float,
                impl: str = "grouped", gemv: str = "linear") -> torch.Tensor:
    """Routed experts + shared expert of one MoE layer on tokens h [T, H] -> [T, H] (model dtype)."""
    weights, ids = route(h, gate32, k, norm_topk_prob, scale, gemv)
    weights, ids = with_shared(weights, ids, n_routed, shared_slots)
    if impl == "gather":
        y = experts_gather(h, ids, w13, w2, inner, "reduce" if gemv == "reduce" else "bmm")
    elif impl == "grouped":
        y = experts_grouped(h, ids, w13, w2, inner)
    else:
        raise ValueError(f"moe impl must be 'gather' or 'grouped', got {impl!r}")
    return combine(y, weights)
