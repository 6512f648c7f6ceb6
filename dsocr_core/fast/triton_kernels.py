"""Hand-written Triton kernels for the two decode pieces Inductor's generated reductions run slowly
(measured on an H200: its expert gather-GEMV reached 1.0-1.4 TB/s and its attention PV reduction 1.5 TB/s):

* `decode_attention_splitkv`: one query per (row, head) against cache slots 0..pos, split over 64-key chunks
  (flash-decoding): every chunk computes its max, exp-sum and weighted V sum in float32, a second kernel merges
  the chunks. Enough programs to fill the GPU at batch 1, each reading whole 16-byte-vectorised K/V tiles.
* `route_rows` + `moe_gemv`: batched decode's MoE without routing glue. One launch turns each row's router
  logits into its slots' expert ids and weights (softmax, greedy top-k, the shared pseudo-experts); then one
  program per (expert, block of output rows) multiplies that expert's weight tile, read in place and once, with
  every row that chose it (an expert has at most one row per token, so a [rows, tokens] tile on the tensor cores),
  the SwiGLU applied in the first kernel, rounded like the reference (gate, up, silu(gate) and the product in the
  model dtype). The grouped path instead prepares routing data in ~19 kernels per layer (docs/fast-mode.md).
* `route_hidden` + `moe_gemv(..., weights, residual)` (engine option expert_fusion 'fused'): the routing kernel
  computes the float32 router logits itself (no router GEMM), and the down kernel's last program of each block of
  output rows combines the slots with their weights and adds the residual (no combine kernel): three launches a MoE
  layer after the norm, where route_rows' path takes six.

Importing this module never fails: without Triton (CPU machines, CI) `HAS_TRITON` is False and the engine uses
its torch formulations. With TRITON_INTERPRET=1 the kernels run on CPU tensors (slowly), which is how the CPU
tests check them when Triton is installed.
"""
from __future__ import annotations

import torch

from .options import BY_EXPERT_MAX_TOKENS, expert_token_tile

try:  # pragma: no cover - depends on the machine
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # pragma: no cover
    triton = tl = None
    HAS_TRITON = False

ATTN_CHUNK = 64  # keys per split
# by-expert MoE blocks: output rows per program, reduction elements per step (on an H100 at batch 2-64, 64x64
# beat 16x256 by 3-9% and 32x128 by up to 1.4%: benchmarks/moe_decode.py)
MOE_BLOCK_N = 64
MOE_BLOCK_K = 64


if HAS_TRITON:
    @triton.jit
    def _attn_partial(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, heads, n_splits,
                      sqb, sqh, skb, skh, skl, svb, svh, svl, scale,
                      D: tl.constexpr, CHUNK: tl.constexpr):
        bh = tl.program_id(0)
        sp = tl.program_id(1)
        b = bh // heads
        h = bh % heads
        pos = tl.load(pos_ptr)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sqb + h * sqh + d).to(tl.float32)
        offs = sp * CHUNK + tl.arange(0, CHUNK)
        valid = offs <= pos
        kt = tl.load(k_ptr + b * skb + h * skh + offs[:, None] * skl + d[None, :], mask=valid[:, None],
                     other=0.0).to(tl.float32)
        s = tl.sum(kt * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m = tl.max(s, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp(s - m_safe)
        vt = tl.load(v_ptr + b * svb + h * svh + offs[:, None] * svl + d[None, :], mask=valid[:, None],
                     other=0.0).to(tl.float32)
        acc = tl.sum(p[:, None] * vt, axis=0)
        idx = bh * n_splits + sp
        tl.store(m_ptr + idx, m)
        tl.store(l_ptr + idx, tl.sum(p, axis=0))
        tl.store(acc_ptr + idx * D + d, acc)

    @triton.jit
    def _attn_combine(m_ptr, l_ptr, acc_ptr, o_ptr, heads, n_splits, sob, soh,
                      D: tl.constexpr, BS: tl.constexpr):
        bh = tl.program_id(0)
        b = bh // heads
        h = bh % heads
        d = tl.arange(0, D)
        sidx = tl.arange(0, BS)
        ok = sidx < n_splits
        m = tl.load(m_ptr + bh * n_splits + sidx, mask=ok, other=float("-inf"))
        l = tl.load(l_ptr + bh * n_splits + sidx, mask=ok, other=0.0)
        mx = tl.max(m, axis=0)  # finite: chunk 0 always holds key 0
        w = tl.exp(m - mx)  # empty chunks: exp(-inf) = 0
        acc = tl.load(acc_ptr + (bh * n_splits + sidx)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)
        tl.store(o_ptr + b * sob + h * soh + d, out.to(o_ptr.dtype.element_ty))

    @triton.jit
    def pick_experts(lg, i, ids_ptr, wts_ptr, scale, E: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr,
                     NORM: tl.constexpr):
        """One token's routing from its float32 router logits `lg` (lanes i; padding lanes -inf): softmax,
        greedy top-k (k rounds of max-and-mask), optional renormalisation, times the scale; the SHARED
        pseudo-experts (ids E, E+1, ...) follow with weight 1. Stores the K + SHARED ids and weights at ids_ptr
        and wts_ptr. The fused batch-1 router (decode_kernels._route) and route_rows both route with it."""
        p = tl.exp(lg - tl.max(lg, axis=0))
        p = p / tl.sum(p, axis=0)
        total = 0.0
        if NORM:  # the sum of the top k, for the renormalisation
            q = p
            for r in tl.static_range(K):
                total += tl.max(q, axis=0)
                q = tl.where(i == tl.argmax(q, axis=0), -1.0, q)
        for r in tl.static_range(K):  # probabilities are >= 0: a taken one masked with -1 is never taken again
            best = tl.max(p, axis=0)
            arg = tl.argmax(p, axis=0)
            if NORM:
                best = best / (total + 1e-20)
            tl.store(ids_ptr + r, arg)
            tl.store(wts_ptr + r, best * scale)
            p = tl.where(i == arg, -1.0, p)
        for j in tl.static_range(SHARED):
            tl.store(ids_ptr + K + j, E + j)
            tl.store(wts_ptr + K + j, 1.0)

    @triton.jit
    def _route_rows(lg_ptr, ids_ptr, wts_ptr, scale, E: tl.constexpr, EP: tl.constexpr, K: tl.constexpr,
                    SHARED: tl.constexpr, NORM: tl.constexpr):
        """Row t's routing (pick_experts) from its float32 router logits [E]: ids [K + SHARED] (int64) and
        weights (float32) at row t of the outputs."""
        t = tl.program_id(0)
        i = tl.arange(0, EP)
        lg = tl.load(lg_ptr + t * E + i, mask=i < E, other=float("-inf"))
        row = t * (K + SHARED)
        pick_experts(lg, i, ids_ptr + row, wts_ptr + row, scale, E, K, SHARED, NORM)

    @triton.jit
    def _tile(rows, rmask, H: tl.constexpr, BK: tl.constexpr):
        """The rows starting at the pointers `rows` [BN] as one [BN, BK] tile (BK >= H: the whole row, masked past
        H), every load issued at once. The fused batch-1 kernels load their weights so before _wait_previous
        (weights are never written during a step)."""
        k = tl.arange(0, BK)
        return tl.load(rows[:, None] + k[None, :], mask=rmask[:, None] & (k < H)[None, :], other=0.0)

    @triton.jit
    def _dot_rows(w, h):
        """float32 [BN] = w [BN, BK] . h [BK]."""
        return tl.sum(w.to(tl.float32) * h[None, :], axis=1)

    @triton.jit
    def _last_to_arrive(cnt_ptr, programs):
        """True in the last of `programs` programs to call this on the counter at cnt_ptr: each program's stores
        before the call are visible to that program (a CTA barrier, then one acquire-release atomic at GPU scope;
        it reads them with .cg loads, past L1). The last program must reset the counter to 0 when done, so that
        every launch, and every replay of a captured one, finds it at zero."""
        tl.debug_barrier()
        return tl.atomic_add(cnt_ptr, 1, sem="acq_rel") == programs - 1

    @triton.jit
    def _route_hidden(h_ptr, g_ptr, lg_ptr, cnt_ptr, ids_ptr, wts_ptr, scale, sht, E: tl.constexpr,
                      EP: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr, NORM: tl.constexpr, H: tl.constexpr,
                      BE: tl.constexpr, BK: tl.constexpr):
        """Program (t, p): row t's float32 router logits of experts p*BE .. p*BE+BE-1, h[t] . gate[e] (gate in
        float32, like the reference router), the whole row as one tile (BK >= H) so every load is issued at once;
        the last of row t's programs to finish (an arrival counter per row, reset by it) routes the row from all E
        logits (pick_experts). The router GEMM, its reduction and route_rows in one launch."""
        t = tl.program_id(0)
        e = tl.program_id(1) * BE + tl.arange(0, BE)
        em = e < E
        w = _tile(g_ptr + e * H, em, H, BK)
        k = tl.arange(0, BK)
        hv = tl.load(h_ptr + t * sht + k, mask=k < H, other=0.0).to(tl.float32)
        tl.store(lg_ptr + t * E + e, _dot_rows(w, hv), mask=em)
        if _last_to_arrive(cnt_ptr + t, tl.num_programs(1)):
            i = tl.arange(0, EP)
            lg = tl.load(lg_ptr + t * E + i, mask=i < E, other=float("-inf"), cache_modifier=".cg")
            row = t * (K + SHARED)
            pick_experts(lg, i, ids_ptr + row, wts_ptr + row, scale, E, K, SHARED, NORM)
            tl.store(cnt_ptr + t, 0)

    @triton.jit
    def _token_hits(ids_ptr, e, T, K8, TP: tl.constexpr, KP: tl.constexpr):
        """Which of the T tokens chose expert e (hit [TP]) and in which of its K8 slots (slot [TP]). A token
        chooses an expert at most once (top-k ids are distinct, the shared experts have their own ids), so an
        expert has at most T rows."""
        t = tl.arange(0, TP)
        j = tl.arange(0, KP)
        m = (t[:, None] < T) & (j[None, :] < K8)
        eq = (tl.load(ids_ptr + t[:, None] * K8 + j[None, :], mask=m, other=-1) == e) & m
        return t, tl.max(eq.to(tl.int32), axis=1) > 0, tl.sum(tl.where(eq, j[None, :], 0), axis=1)

    @triton.jit
    def _moe_up(x_ptr, ids_ptr, w_ptr, out_ptr, T, K8, sxt, swe, swn, H: tl.constexpr, I: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr, KP: tl.constexpr):
        e = tl.program_id(0)
        nb = tl.program_id(1)
        t, hit, slot = _token_hits(ids_ptr, e, T, K8, TP, KP)
        if tl.max(hit.to(tl.int32), axis=0) > 0:  # an expert no token chose reads nothing
            n = nb * BN + tl.arange(0, BN)
            nm = n < I
            acc_g = tl.zeros([BN, TP], dtype=tl.float32)
            acc_u = tl.zeros([BN, TP], dtype=tl.float32)
            base = w_ptr + e.to(tl.int64) * swe
            for k0 in range(0, H, BK):
                k = k0 + tl.arange(0, BK)
                km = k < H
                xt = tl.load(x_ptr + t[None, :] * sxt + k[:, None], mask=km[:, None] & hit[None, :], other=0.0)
                msk = nm[:, None] & km[None, :]
                wg = tl.load(base + n[:, None] * swn + k[None, :], mask=msk, other=0.0)
                wu = tl.load(base + (n[:, None] + I) * swn + k[None, :], mask=msk, other=0.0)
                acc_g = tl.dot(wg, xt, acc_g, input_precision="ieee")
                acc_u = tl.dot(wu, xt, acc_u, input_precision="ieee")
            dt = out_ptr.dtype.element_ty
            g = acc_g.to(dt).to(tl.float32)  # gate_proj output in the model dtype
            u = acc_u.to(dt).to(tl.float32)
            a = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * u  # silu(gate), then times up
            rows = t * K8 + slot
            tl.store(out_ptr + rows[None, :] * I + n[:, None], a.to(dt), mask=nm[:, None] & hit[None, :])

    @triton.jit
    def _moe_down(a_ptr, ids_ptr, w_ptr, out_ptr, wts_ptr, res_ptr, x_ptr, cnt_ptr, T, K8, swe, swn,
                  H: tl.constexpr, I: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TP: tl.constexpr,
                  KP: tl.constexpr, COMBINE: tl.constexpr):
        """Program (e, nb): expert e's down projection of output rows nb*BN.. for every token that chose it, each
        (token, slot) output rounded to the model dtype into out. COMBINE: the last program of block nb to finish
        (an arrival counter per block, over every expert's program, reset by it) reads the block's slot outputs
        of every token back, sums them weighted in float32 in slot order, rounds the sum to the experts' output
        dtype and adds it to the residual (res) into x, as `x + moe.combine(y, w)` does: the weighted combine +
        residual without a launch of its own."""
        e = tl.program_id(0)
        nb = tl.program_id(1)
        n = nb * BN + tl.arange(0, BN)
        nm = n < H
        t, hit, slot = _token_hits(ids_ptr, e, T, K8, TP, KP)
        if tl.max(hit.to(tl.int32), axis=0) > 0:
            rows = t * K8 + slot
            acc = tl.zeros([BN, TP], dtype=tl.float32)
            base = w_ptr + e.to(tl.int64) * swe
            for k0 in range(0, I, BK):
                k = k0 + tl.arange(0, BK)
                km = k < I
                at = tl.load(a_ptr + rows[None, :] * I + k[:, None], mask=km[:, None] & hit[None, :], other=0.0)
                w = tl.load(base + n[:, None] * swn + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
                acc = tl.dot(w, at, acc, input_precision="ieee")
            tl.store(out_ptr + rows[None, :] * H + n[:, None], acc.to(out_ptr.dtype.element_ty),
                     mask=nm[:, None] & hit[None, :])
        if COMBINE:
            if _last_to_arrive(cnt_ptr + nb, tl.num_programs(0)):
                tm = t < T
                m = tm[:, None] & nm[None, :]
                total = tl.zeros([TP, BN], dtype=tl.float32)
                for j in tl.static_range(KP):  # slot order; slots past K8 (KP is K8's power of two) add zeros
                    mj = tm & (j < K8)
                    y = tl.load(out_ptr + (t * K8 + j)[:, None] * H + n[None, :], mask=mj[:, None] & nm[None, :],
                                other=0.0, cache_modifier=".cg").to(tl.float32)
                    total += y * tl.load(wts_ptr + t * K8 + j, mask=mj, other=0.0)[:, None]
                summed = total.to(out_ptr.dtype.element_ty).to(tl.float32)  # combine() returns y's dtype
                r = tl.load(res_ptr + t[:, None] * H + n[None, :], mask=m, other=0.0).to(tl.float32)
                tl.store(x_ptr + t[:, None] * H + n[None, :], (r + summed).to(x_ptr.dtype.element_ty), mask=m)
                tl.store(cnt_ptr + nb, 0)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton block sizes."""
    return 1 << max(0, (n - 1).bit_length())


def decode_attention_splitkv(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                             pos: torch.Tensor) -> torch.Tensor:
    """q [B, heads, d]; keys/values [B, heads, L, d] (last dim contiguous); pos long [1] -> [B, heads, d]."""
    b, heads, d = q.shape
    length = keys.shape[2]
    n_splits = triton.cdiv(length, ATTN_CHUNK)
    m = torch.empty(b * heads * n_splits, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty(b * heads * n_splits, d, dtype=torch.float32, device=q.device)
    out = torch.empty(b, heads, d, dtype=q.dtype, device=q.device)
    _attn_partial[(b * heads, n_splits)](
        q, keys, values, pos, m, l, acc, heads, n_splits, q.stride(0), q.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        d ** -0.5, D=d, CHUNK=ATTN_CHUNK, num_warps=4)
    _attn_combine[(b * heads,)](m, l, acc, out, heads, n_splits, out.stride(0), out.stride(1), D=d,
                                BS=next_pow2(n_splits), num_warps=4)
    return out


def moe_gemv(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
             weights: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], ids [T, K] -> per-slot expert outputs [T, K, H] in x's dtype (SwiGLU experts). One program per
    (expert, block of output rows) over every token that chose the expert: each touched expert's weights are
    read once whatever the batch, and no routing data is prepared (no sort, no scan, no gather).
    With `weights` [T, K] (float32) and `residual` [T, H]: residual + the weighted combine of the slots, [T, H],
    done by the down kernel's last program of each block of output rows (no combine launch).
    Preconditions: each row's K ids are distinct (top-k ids and the shared experts' ids are; a repeated id would
    send two slots to one output row) and T <= options.BY_EXPERT_MAX_TOKENS (ValueError otherwise)."""
    t, k = ids.shape
    if t > BY_EXPERT_MAX_TOKENS:
        raise ValueError(f"moe_gemv takes up to {BY_EXPERT_MAX_TOKENS} tokens (its per-expert token tile), got {t}")
    if (weights is None) != (residual is None):
        raise ValueError("moe_gemv combines with both weights and residual, or with neither")
    if weights is not None and (tuple(weights.shape) != (t, k) or tuple(residual.shape) != (t, x.shape[1])):
        raise ValueError(f"moe_gemv: weights {tuple(weights.shape)} and residual {tuple(residual.shape)} must be "
                         f"[{t}, {k}] and [{t}, {x.shape[1]}] (the ids' rows and slots, x's rows and width)")
    hdim = x.shape[1]
    inner = w2.shape[2]
    experts = w13.shape[0]
    ids = ids.contiguous()
    tp, kp = expert_token_tile(t), next_pow2(k)  # tl.dot needs every side >= 16
    act = torch.empty(t * k, inner, dtype=x.dtype, device=x.device)
    _moe_up[(experts, triton.cdiv(inner, MOE_BLOCK_N))](
        x, ids, w13, act, t, k, x.stride(0), w13.stride(0), w13.stride(1), H=hdim, I=inner, BN=MOE_BLOCK_N,
        BK=MOE_BLOCK_K, TP=tp, KP=kp, num_warps=4, num_stages=3)
    out = torch.empty(t * k, hdim, dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(hdim, MOE_BLOCK_N)
    combine = weights is not None
    if combine:
        weights, residual = weights.float().contiguous(), residual.contiguous()
        combined = torch.empty_like(residual)
        counts = arrival_counters(x.device, "moe_down", blocks)
    else:  # unused pointers
        weights = residual = combined = counts = out
    _moe_down[(experts, blocks)](
        act, ids, w2, out, weights, residual, combined, counts, t, k, w2.stride(0), w2.stride(1), H=hdim,
        I=inner, BN=MOE_BLOCK_N, BK=MOE_BLOCK_K, TP=tp, KP=kp, COMBINE=combine, num_warps=4, num_stages=3)
    return combined if combine else out.view(t, k, hdim)


# arrival counters of the kernels whose last program merges the others' results, per (device, kernel): zeros
# kept for good (each merging program resets its counter, so every launch finds them zero), created outside any
# CUDA-graph capture (a graph's pool would reclaim them), so a captured launch reads the same buffer on every
# replay. A larger buffer replaces a smaller one for later launches, and the smaller one is kept too: graphs
# captured with it still hold its address. One stream at a time: two launches sharing counters concurrently would
# leave them non-zero (the engine runs its steps on one stream).
_COUNTERS: dict[tuple[str, str], list[torch.Tensor]] = {}


def arrival_counters(device: torch.device, kernel: str, n: int) -> torch.Tensor:
    """At least n int32 zeros for `kernel`'s arrival counters on `device` (see _COUNTERS)."""
    held = _COUNTERS.setdefault((str(device), kernel), [])
    if not held or held[-1].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{kernel}: its arrival counters must be created before a CUDA graph is captured "
                               "(run the work once eagerly first, as graphs.Captured does)")
        held.append(torch.zeros(max(n, 64), dtype=torch.int32, device=device))
    return held[-1]


# experts per program of route_hidden (4 fp32 rows of 2,048 lanes: 64 registers a thread on 4 warps), and the widest
# hidden size it takes as one tile (wider rows would spill registers: route_rows' path serves them)
ROUTE_EXPERTS, ROUTE_MAX_HIDDEN = 4, 4096


def route_hidden(h: torch.Tensor, gate: torch.Tensor, k: int, shared: int, norm_topk_prob: bool,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised hidden states h [T, H] and the float32 router weight [E, H] -> (weights float32 [T, k + shared],
    ids long [T, k + shared]): the router GEMM, moe.route and moe.with_shared in one launch (ROUTE_EXPERTS experts
    a program, each row routed by its last program). The logits' float32 sums and the softmax follow Triton's
    order, so logits and weights can differ from torch's in the last bits (a near-tie could pick the other
    expert: a rounding difference, like the fused batch-1 router's)."""
    t, hdim = h.shape
    e = gate.shape[0]
    if hdim > ROUTE_MAX_HIDDEN:
        raise ValueError(f"route_hidden loads a row as one tile, up to {ROUTE_MAX_HIDDEN} wide; got {hdim} (use "
                         "expert_fusion='separate')")
    h = h.contiguous()
    logits = torch.empty(t, e, dtype=torch.float32, device=h.device)
    ids = torch.empty(t, k + shared, dtype=torch.long, device=h.device)
    weights = torch.empty(t, k + shared, dtype=torch.float32, device=h.device)
    _route_hidden[(t, triton.cdiv(e, ROUTE_EXPERTS))](
        h, gate.float().contiguous(), logits, arrival_counters(h.device, "route_hidden", t), ids, weights, scale,
        h.stride(0), E=e, EP=next_pow2(e), K=k, SHARED=shared, NORM=norm_topk_prob, H=hdim, BE=ROUTE_EXPERTS,
        BK=next_pow2(hdim), num_warps=4)
    return weights, ids


def route_rows(logits: torch.Tensor, k: int, shared: int, norm_topk_prob: bool,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 router logits [T, E] -> (weights float32 [T, k + shared], ids long [T, k + shared]): moe.route and
    moe.with_shared in one launch (one program per row). The softmax uses Triton's exp and its own summation
    order, so weights can differ from torch's in the last bits (a near-tie could pick the other expert: a
    rounding difference, like the fused batch-1 router's)."""
    t, e = logits.shape
    logits = logits.contiguous()
    ids = torch.empty(t, k + shared, dtype=torch.long, device=logits.device)
    weights = torch.empty(t, k + shared, dtype=torch.float32, device=logits.device)
    _route_rows[(t,)](logits, ids, weights, scale, E=e, EP=next_pow2(e), K=k, SHARED=shared, NORM=norm_topk_prob,
                      num_warps=1)
    return weights, ids
