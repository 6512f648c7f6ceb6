"""Triton kernels for the grouped MoE's row movement around its two grouped GEMMs (prefill, and decode above the
by-expert kernels' batch limit):

* `group_rows`: each (token, slot) row's place in expert order and each expert's group end (moe.group_rows'
  result) in three small kernels: the experts' counts per chunk of rows, the chunks' offsets per expert, each
  row's place.
* `scatter_rows`: each token's hidden row copied to its K (token, slot) places in expert order (`xs[dest[t*K + j]]
  = x[t]`): one program per (token, block of features) reads the row once and writes it K times.
* `gather_combine`: the experts' output rows read back in (token, slot) order, weighted with the routing weights
  and summed in float32 in slot order, rounded to the model dtype, then added to the residual (the reference's
  `x + (y.float() * w).sum(1).to(dtype)`).

Why: Inductor compiles the same steps (moe.group_rows' one-hot scan, moe.to_expert_order and moe.combine_rows,
the torch formulations) into kernels that, inside the compiled prefill layer with the synthetic router's
uneven loads, ran far longer than their bytes take on an H200 (the combine 301 us a layer at 3,098 tokens, the scan
193 us at 14,088; docs/fast-mode.md). The row kernels read and write each row once, 16-byte vectors along the
features.

Each is a `torch.library.triton_op`, so the compiled prefill layer calls it as one opaque kernel whatever its
(symbolic) token count. Without Triton (CPU machines) `HAS_ROW_KERNELS` is False and the engine keeps the torch
formulation; with TRITON_INTERPRET=1 the kernels run on CPU tensors, which is how the CPU tests check them.
"""
from __future__ import annotations

import torch

from .options import expert_lanes
from .triton_kernels import HAS_TRITON, triton, tl

GROUP_CHUNK = 256  # (token, slot) rows per program of the grouping kernels
GROUP_SCAN = 1024  # chunks per step of the chunks' offsets scan
GROUP_STEPS = 16  # its steps at most: 4,194,304 rows (524,288 tokens of 8 slots) per MoE call
GROUP_MAX_ROWS = GROUP_CHUNK * GROUP_SCAN * GROUP_STEPS
ROW_BLOCK = 256  # features per program: 1,280-wide rows in 5 blocks; 8 bf16 (16 bytes) per thread at 1 warp
ROW_WARPS = 1

HAS_ROW_KERNELS = HAS_TRITON and hasattr(torch.library, "triton_op")


if HAS_ROW_KERNELS:
    @triton.jit
    def _chunk_counts(ids_ptr, counts_ptr, total_ptr, R, E, CH: tl.constexpr, EP: tl.constexpr):
        """Rows of each expert in chunk c of CH rows (counts [chunk, EP]), added to the experts' totals."""
        c = tl.program_id(0)
        r = c * CH + tl.arange(0, CH)
        e = tl.arange(0, EP)
        ids = tl.load(ids_ptr + r, mask=r < R, other=-1)
        n = tl.sum((ids[:, None] == e[None, :]).to(tl.int32), axis=0)
        tl.store(counts_ptr + c * EP + e, n)
        tl.atomic_add(total_ptr + e, n, mask=e < E)

    @triton.jit
    def _chunk_bases(counts_ptr, total_ptr, base_ptr, ends_ptr, NC, E, EP: tl.constexpr, CB: tl.constexpr,
                     STEPS: tl.constexpr):
        """Expert e's first place in chunk c: the rows of every lower expert, then expert e's rows in the chunks
        before c (base [chunk, EP]); and the end of expert e's group. Steps of CB chunks, as many as there are
        chunks (a fixed loop with a test: Triton's interpreter, which the CPU tests run, cannot loop to a runtime
        bound)."""
        e = tl.program_id(0)
        x = tl.arange(0, EP)
        carry = tl.sum(tl.where(x < e, tl.load(total_ptr + x, mask=x < E, other=0), 0), axis=0)
        for i in tl.static_range(STEPS):
            if i * CB < NC:
                c = i * CB + tl.arange(0, CB)
                n = tl.load(counts_ptr + c * EP + e, mask=c < NC, other=0)
                tl.store(base_ptr + c * EP + e, carry + tl.cumsum(n, axis=0) - n, mask=c < NC)
                carry += tl.sum(n, axis=0)
        tl.store(ends_ptr + e, carry)

    @triton.jit
    def _place_rows(ids_ptr, base_ptr, dest_ptr, R, CH: tl.constexpr, EP: tl.constexpr):
        """Each row's place: its expert's base in its chunk plus the rows of that expert before it in the chunk."""
        c = tl.program_id(0)
        r = c * CH + tl.arange(0, CH)
        e = tl.arange(0, EP)
        ids = tl.load(ids_ptr + r, mask=r < R, other=-1)
        onehot = (ids[:, None] == e[None, :]).to(tl.int32)
        rank = tl.sum(tl.cumsum(onehot, axis=0) * onehot, axis=1) - 1
        base = tl.load(base_ptr + c * EP + e)
        place = tl.sum(onehot * base[None, :], axis=1) + rank
        tl.store(dest_ptr + r, place.to(tl.int64), mask=r < R)

    @triton.jit
    def _scatter_rows(x_ptr, dest_ptr, out_ptr, H, K: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < H
        row = tl.load(x_ptr + t.to(tl.int64) * H + offs, mask=mask)
        for j in tl.static_range(K):
            d = tl.load(dest_ptr + t * K + j).to(tl.int64)
            tl.store(out_ptr + d * H + offs, row, mask=mask)

    @triton.jit
    def _gather_combine(ys_ptr, dest_ptr, w_ptr, res_ptr, out_ptr, H, K: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < H
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(K):  # slot order, like the reference's sum over the slots
            d = tl.load(dest_ptr + t * K + j).to(tl.int64)
            w = tl.load(w_ptr + t * K + j)
            y = tl.load(ys_ptr + d * H + offs, mask=mask, other=0.0).to(tl.float32)
            acc += y * w
        dt = out_ptr.dtype.element_ty
        base = t.to(tl.int64) * H + offs
        r = tl.load(res_ptr + base, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + base, (r + acc.to(dt).to(tl.float32)).to(dt), mask=mask)

    @torch.library.triton_op("dsocr::group_rows", mutates_args=())
    def group_rows(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """moe.group_rows in three kernels: (dest: each flat (token, slot) row's place in expert order, rows of
        one expert in their order [R] int64; ends: int32 end of each expert's group [E]). Per chunk of rows the
        experts' counts, then per expert the chunks' offsets, then per row its place."""
        flat = ids.reshape(-1).contiguous()
        r = flat.numel()
        if r > GROUP_MAX_ROWS:
            raise ValueError(f"group_rows takes up to {GROUP_MAX_ROWS} rows, got {r}")
        ep = expert_lanes(n_experts)
        chunks = triton.cdiv(r, GROUP_CHUNK)
        counts = flat.new_empty(chunks * ep, dtype=torch.int32)
        total = flat.new_zeros(ep, dtype=torch.int32)
        base = torch.empty_like(counts)
        ends = flat.new_empty(n_experts, dtype=torch.int32)
        dest = torch.empty_like(flat, dtype=torch.int64)
        torch.library.wrap_triton(_chunk_counts)[(chunks,)](flat, counts, total, r, n_experts, CH=GROUP_CHUNK,
                                                            EP=ep, num_warps=8)
        torch.library.wrap_triton(_chunk_bases)[(n_experts,)](counts, total, base, ends, chunks, n_experts, EP=ep,
                                                              CB=GROUP_SCAN, STEPS=GROUP_STEPS, num_warps=4)
        torch.library.wrap_triton(_place_rows)[(chunks,)](flat, base, dest, r, CH=GROUP_CHUNK, EP=ep, num_warps=8)
        return dest, ends

    @torch.library.triton_op("dsocr::scatter_rows", mutates_args=())
    def scatter_rows(x: torch.Tensor, dest: torch.Tensor, k: int) -> torch.Tensor:
        """x [T, H], dest [T*K] (each (token, slot) row's place in expert order) -> rows in expert order
        [T*K, H]."""
        x, dest = x.contiguous(), dest.contiguous()
        t, h = x.shape
        out = x.new_empty(t * k, h)
        torch.library.wrap_triton(_scatter_rows)[(t, triton.cdiv(h, ROW_BLOCK))](
            x, dest, out, h, K=k, BLOCK=ROW_BLOCK, num_warps=ROW_WARPS)
        return out

    @torch.library.triton_op("dsocr::gather_combine", mutates_args=())
    def gather_combine(ys: torch.Tensor, dest: torch.Tensor, weights: torch.Tensor,
                       residual: torch.Tensor) -> torch.Tensor:
        """ys [T*K, H] (rows in expert order), dest [T*K], weights float32 [T, K], residual [T, H] -> residual +
        the weighted sum over each token's slots [T, H] (float32 sum in slot order, rounded to the model dtype
        before the residual is added)."""
        ys, dest, weights, residual = (a.contiguous() for a in (ys, dest, weights, residual))
        t, k = weights.shape
        h = ys.shape[1]
        out = torch.empty_like(residual)
        torch.library.wrap_triton(_gather_combine)[(t, triton.cdiv(h, ROW_BLOCK))](
            ys, dest, weights, residual, out, h, K=k, BLOCK=ROW_BLOCK, num_warps=ROW_WARPS)
        return out
