"""Fused batch-1 decode: a decoder layer in six Triton kernels (five for the dense first layer, which has no
router), so the whole step is 72 kernels with the lm_head, 74 in generation with the n-gram ban and the choice (one
CUDA graph), reading each weight once, most of them at 2.5-3.6 TB/s.

Why: at batch 1 a decode step is a chain of GEMVs over 1.15 GB of weights; a profile of the compiled step
(docs/fast-mode.md) showed ~25 kernels per layer, most of them small, and the GEMVs Inductor generated ran at
0.7-1.9 TB/s. Here every kernel that reads weights does its neighbours' elementwise work on the fly:

  qkv_rope     RMSNorm(x) -> q/k/v GEMV -> RoPE on q and k -> q out, k and v written into the static cache
               (first layer: reads the token's embedding row and copies it into x)
  attention    flash-decoding over 32-slot chunks of the cache; each head's last chunk merges the partials
  oproj        o_proj GEMV + residual add, in place on x
  router       RMSNorm(x) -> fp32 router logits; the last program does softmax + greedy top-k and writes each
               slot's expert id and weight; extra programs in the same launch run the shared experts' SwiGLU
  expert_up    RMSNorm(x), the routed expert's gate/up rows, SwiGLU (the dense first layer: its one "expert")
  expert_down  one program per (row block, slot); the block's last slot adds the slots in slot order and the
               residual
  lm_head      final RMSNorm + lm_head GEMV -> float32 logits, and per block the best token after the n-gram ban
  ngram_ban / choose   the vendor's no-repeat-n-gram ban and the greedy choice, on the device

Launch order (programmatic dependent launch, Hopper): each kernel lets the next one launch at once (_launch_next),
loads what nothing in the step writes (its weight rows), and only then waits for the previous kernel
(_wait_previous). The q/k/v and the routed gate/up kernels let the next kernel launch only after their own wait, so
the attention may also load the position and earlier steps' cache slots early, and the down kernel the router's
choice and those experts' rows (docs/fast-mode.md, "Batch 1: weights before the wait").

"Last program" merges use an arrival counter per output block (atomic add with acquire/release, reset by the
merging program) and read the partials in a fixed order, so results do not depend on scheduling.
Reduction chunks as wide as the whole row (2048 lanes for 1280 values, the rest masked) issue every load of a
program at once: with 256-wide chunks each program waited for five HBM round trips in turn.

Rounding follows the reference where it rounds to the model dtype: the normalised activations, every projection
output, the attention output, each expert's output, gate/up/silu products and the combined MoE output. RoPE and
the router are computed in float32 and rounded once (as the compiled path did), which is inside the rounding the
parity tests allow. Nothing here syncs with the host: positions, token ids and the ban stamps live on the device.
"""
from __future__ import annotations

from .triton_kernels import HAS_TRITON, next_pow2, tl, triton

if HAS_TRITON:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    from .triton_kernels import _dot_rows, _last_to_arrive, _tile, pick_experts

    @triton.jit
    def _launch_next(PDL: tl.constexpr):
        """Programmatic dependent launch (Hopper): let the next kernel launch now, so its launch, scheduling and
        weight loads overlap this kernel's run (its programs then wait in _wait_previous)."""
        if PDL:
            gdc_launch_dependents()

    @triton.jit
    def _wait_previous(PDL: tl.constexpr):
        """Wait until the previous kernel has finished and its writes are visible. Every kernel of the step calls
        this before it reads anything a kernel writes (activations, positions, routing, the cache) and before it
        writes anything, so ordering stays transitive along the chain; only weights, which nothing in the step
        writes, may be loaded before it."""
        if PDL:
            gdc_wait()

    @triton.jit
    def _after_predecessor(PDL: tl.constexpr):
        """_launch_next then _wait_previous: for kernels that load nothing before their inputs are ready."""
        _launch_next(PDL)
        _wait_previous(PDL)

    @triton.jit
    def _rstd(x_ptr, eps, H: tl.constexpr, BK: tl.constexpr):
        """1 / sqrt(mean(x^2) + eps) over x [H], in float32."""
        acc = tl.zeros([BK], dtype=tl.float32)
        for k0 in tl.static_range(0, H, BK):
            k = k0 + tl.arange(0, BK)
            xv = tl.load(x_ptr + k, mask=k < H, other=0.0).to(tl.float32)
            acc += xv * xv
        return tl.math.rsqrt(tl.sum(acc, axis=0) / H + eps)

    @triton.jit
    def _normed(x_ptr, ln_ptr, k, km, rstd):
        """The reference RMSNorm of a chunk: float32 statistics, cast back to the model dtype, times the weight
        (rounded to the model dtype); returned in float32."""
        dt = x_ptr.dtype.element_ty
        xv = tl.load(x_ptr + k, mask=km, other=0.0).to(tl.float32)
        h = (xv * rstd).to(dt).to(tl.float32)
        w = tl.load(ln_ptr + k, mask=km, other=0.0).to(tl.float32)
        return (w * h).to(dt).to(tl.float32)

    @triton.jit
    def _normed_row(x_ptr, ln_ptr, eps, H: tl.constexpr, BK: tl.constexpr):
        """RMSNorm(x) as one float32 [BK] row (BK >= H, zero past H), to multiply with _tile's tiles."""
        k = tl.arange(0, BK)
        return _normed(x_ptr, ln_ptr, k, k < H, _rstd(x_ptr, eps, H, BK))

    @triton.jit
    def _normed_gemv(x_ptr, ln_ptr, rows, rmask, eps, H: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """float32 [BN] = W . RMSNorm(x), W's rows starting at the pointers `rows` [BN] (masked by rmask)."""
        rstd = _rstd(x_ptr, eps, H, BK)
        acc = tl.zeros([BN], dtype=tl.float32)
        for k0 in tl.static_range(0, H, BK):
            k = k0 + tl.arange(0, BK)
            km = k < H
            h = _normed(x_ptr, ln_ptr, k, km, rstd)
            w = tl.load(rows[:, None] + k[None, :], mask=rmask[:, None] & km[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
        return acc

    @triton.jit
    def _qkv_rope(x_ptr, ln_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, tok_ptr, emb_ptr, s_kh,
                  s_kl, s_vh, s_vl, eps, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
                  EMBED: tl.constexpr, PDL: tl.constexpr = False):
        """Program = BR rotation pairs (rows j and j + D/2) of one head of q, k or v. EMBED (first layer): the
        input is the token's embedding row, which program 0 also copies into x (the residual stream). With BK >= H
        the program's weight rows are loaded before it waits for the previous kernel. It lets the attention launch
        only after that wait: when the attention starts, every kernel before this one has finished, so the cache
        slots of earlier steps and the position are final and it loads them before waiting for this kernel."""
        HALF: tl.constexpr = D // 2
        HEADS: tl.constexpr = H // D
        pid = tl.program_id(0)
        part_head = pid // (HALF // BR)  # 0 .. 3*HEADS-1: q heads, then k heads, then v heads
        j = (pid % (HALF // BR)) * BR + tl.arange(0, BR)
        r1 = part_head * D + j  # rows of wqkv [3H, H]: part*H + head*D + j
        every = j >= 0
        if BK >= H:
            w1 = _tile(w_ptr + r1 * H, every, H, BK)
            w2 = _tile(w_ptr + (r1 + HALF) * H, every, H, BK)
        _wait_previous(PDL)
        _launch_next(PDL)
        if EMBED:
            src = emb_ptr + tl.load(tok_ptr) * H
            if pid == 0:
                kk = tl.arange(0, BK)
                for k0 in tl.static_range(0, H, BK):
                    tl.store(x_ptr + k0 + kk, tl.load(src + k0 + kk, mask=k0 + kk < H), mask=k0 + kk < H)
            x_ptr = src
        if BK >= H:
            h = _normed_row(x_ptr, ln_ptr, eps, H, BK)
            a1 = _dot_rows(w1, h)
            a2 = _dot_rows(w2, h)
        else:
            a1 = _normed_gemv(x_ptr, ln_ptr, w_ptr + r1 * H, every, eps, H, BR, BK)
            a2 = _normed_gemv(x_ptr, ln_ptr, w_ptr + (r1 + HALF) * H, every, eps, H, BR, BK)
        dt = q_ptr.dtype.element_ty
        a1 = a1.to(dt).to(tl.float32)  # the projection's output in the model dtype
        a2 = a2.to(dt).to(tl.float32)
        part = part_head // HEADS
        head = part_head % HEADS
        pos = tl.load(pos_ptr)
        if part < 2:  # RoPE (rotate-half): x*cos + rotate_half(x)*sin
            c1 = tl.load(cos_ptr + pos * D + j).to(tl.float32)
            s1 = tl.load(sin_ptr + pos * D + j).to(tl.float32)
            c2 = tl.load(cos_ptr + pos * D + HALF + j).to(tl.float32)
            s2 = tl.load(sin_ptr + pos * D + HALF + j).to(tl.float32)
            o1 = a1 * c1 - a2 * s1
            o2 = a2 * c2 + a1 * s2
        else:
            o1 = a1
            o2 = a2
        if part == 0:
            tl.store(q_ptr + head * D + j, o1.to(dt))
            tl.store(q_ptr + head * D + HALF + j, o2.to(dt))
        elif part == 1:
            tl.store(kc_ptr + head * s_kh + pos * s_kl + j, o1.to(dt))
            tl.store(kc_ptr + head * s_kh + pos * s_kl + HALF + j, o2.to(dt))
        else:
            tl.store(vc_ptr + head * s_vh + pos * s_vl + j, o1.to(dt))
            tl.store(vc_ptr + head * s_vh + pos * s_vl + HALF + j, o2.to(dt))

    @triton.jit
    def _oproj_residual(o_ptr, w_ptr, x_ptr, H: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        PDL: tl.constexpr = False):
        """x[n] += round(wo[n] . o) for this program's BN rows (in place: each program owns its rows). With BK >= H
        the rows are loaded before the program waits for the previous kernel."""
        _launch_next(PDL)
        n = tl.program_id(0) * BN + tl.arange(0, BN)
        if BK >= H:
            w_all = _tile(w_ptr + n * H, n >= 0, H, BK)
        _wait_previous(PDL)
        acc = tl.zeros([BN], dtype=tl.float32)
        for k0 in tl.static_range(0, H, BK):
            k = k0 + tl.arange(0, BK)
            km = k < H
            ov = tl.load(o_ptr + k, mask=km, other=0.0).to(tl.float32)
            if BK >= H:
                w = w_all
            else:
                w = tl.load(w_ptr + n[:, None] * H + k[None, :], mask=km[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * ov[None, :], axis=1)
        dt = x_ptr.dtype.element_ty
        xv = tl.load(x_ptr + n).to(tl.float32)
        tl.store(x_ptr + n, (xv + acc.to(dt).to(tl.float32)).to(dt))

    @triton.jit
    def _router(x_ptr, ln_ptr, g_ptr, lg_ptr, cnt_ptr, ids_ptr, wts_ptr, w13_ptr, act_ptr, eps, scale, swe,
                E: tl.constexpr, EP: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr, NORM: tl.constexpr,
                H: tl.constexpr, I: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, BN_UP: tl.constexpr,
                BK_UP: tl.constexpr, PDL: tl.constexpr = False):
        """Programs 0..NR-1: float32 router logits of BE experts, RMSNorm(x) . gate[e] (gate in float32, like the
        reference); the last of them to finish (a counter) turns all E logits into the slots' expert ids and
        weights: softmax, greedy top-k (+ renormalisation), times the scale; the shared pseudo-experts follow
        with weight 1. The programs after them compute the shared pseudo-experts' SwiGLU (_swiglu_rows), which
        needs no routing, so it overlaps the router's latency instead of waiting for it. Both kinds of program
        load their weights before waiting for the previous kernel when their chunk is the whole row."""
        _launch_next(PDL)
        NR: tl.constexpr = (E + BE - 1) // BE
        pid = tl.program_id(0)
        if pid >= NR:
            blocks: tl.constexpr = (I + BN_UP - 1) // BN_UP
            j = (pid - NR) // blocks
            n = ((pid - NR) % blocks) * BN_UP + tl.arange(0, BN_UP)
            if BK_UP < H:
                _wait_previous(PDL)
            _swiglu_rows(x_ptr, ln_ptr, w13_ptr + (E + j).to(tl.int64) * swe, act_ptr, K + j, n, eps, H, I,
                         BN_UP, BK_UP, BK_UP >= H, PDL)
        else:
            _route(x_ptr, ln_ptr, g_ptr, lg_ptr, cnt_ptr, ids_ptr, wts_ptr, pid, eps, scale, E, EP, K, SHARED, NORM,
                   H, NR, BE, BK, PDL)

    @triton.jit
    def _route(x_ptr, ln_ptr, g_ptr, lg_ptr, cnt_ptr, ids_ptr, wts_ptr, pid, eps, scale, E: tl.constexpr,
               EP: tl.constexpr, K: tl.constexpr, SHARED: tl.constexpr, NORM: tl.constexpr, H: tl.constexpr,
               NR: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
        """The router part of _router (program pid of NR)."""
        e = pid * BE + tl.arange(0, BE)
        em = e < E
        if BK >= H:
            w = _tile(g_ptr + e * H, em, H, BK)
            _wait_previous(PDL)
            logits = _dot_rows(w, _normed_row(x_ptr, ln_ptr, eps, H, BK))
        else:
            _wait_previous(PDL)
            logits = _normed_gemv(x_ptr, ln_ptr, g_ptr + e * H, em, eps, H, BE, BK)
        tl.store(lg_ptr + e, logits, mask=em)
        if _last_to_arrive(cnt_ptr, NR):
            i = tl.arange(0, EP)
            lg = tl.load(lg_ptr + i, mask=i < E, other=float("-inf"), cache_modifier=".cg")
            pick_experts(lg, i, ids_ptr, wts_ptr, scale, E, K, SHARED, NORM)
            tl.store(cnt_ptr, 0)

    @triton.jit
    def _swiglu_rows(x_ptr, ln_ptr, base, act_ptr, s, n, eps, H: tl.constexpr, I: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
        """silu(gate) * up of inner units n of the expert at `base` ([2I, H]: gate rows, then up rows) on
        RMSNorm(x), rounded like the reference (gate, up, silu(gate) and the product in the model dtype), into
        act[s, n]. EARLY (BK >= H, and `base` known without the previous kernel's results): the rows are loaded
        first, then the program waits for the previous kernel; otherwise the caller has already waited."""
        nm = n < I
        if EARLY:
            wg = _tile(base + n * H, nm, H, BK)
            wu = _tile(base + (n + I) * H, nm, H, BK)
            _wait_previous(PDL)
            h = _normed_row(x_ptr, ln_ptr, eps, H, BK)
            acc_g = _dot_rows(wg, h)
            acc_u = _dot_rows(wu, h)
        else:
            rstd = _rstd(x_ptr, eps, H, BK)
            acc_g = tl.zeros([BN], dtype=tl.float32)
            acc_u = tl.zeros([BN], dtype=tl.float32)
            for k0 in tl.static_range(0, H, BK):
                k = k0 + tl.arange(0, BK)
                km = k < H
                h = _normed(x_ptr, ln_ptr, k, km, rstd)
                msk = nm[:, None] & km[None, :]
                wg = tl.load(base + n[:, None] * H + k[None, :], mask=msk, other=0.0)
                wu = tl.load(base + (n + I)[:, None] * H + k[None, :], mask=msk, other=0.0)
                acc_g += tl.sum(wg.to(tl.float32) * h[None, :], axis=1)
                acc_u += tl.sum(wu.to(tl.float32) * h[None, :], axis=1)
        dt = act_ptr.dtype.element_ty
        g = acc_g.to(dt).to(tl.float32)
        u = acc_u.to(dt).to(tl.float32)
        a = (g * tl.sigmoid(g)).to(dt).to(tl.float32) * u
        tl.store(act_ptr + s * I + n, a.to(dt), mask=nm)

    @triton.jit
    def _expert_up(x_ptr, ln_ptr, ids_ptr, w_ptr, act_ptr, eps, swe, H: tl.constexpr, I: tl.constexpr,
                   DENSE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
        """Program (routed slot, block of BN inner units): _swiglu_rows of the slot's expert (id from _router).
        DENSE: one slot, the dense MLP (w_ptr [2I, H]), whose rows are loaded before waiting for the previous kernel
        when BK >= H. A routed expert's rows wait for the router's choice, and only then is the down kernel let
        launch: when it starts the router has finished, so it loads the chosen experts' rows before waiting for
        this kernel (_expert_down)."""
        s = tl.program_id(0)
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        if DENSE:
            _launch_next(PDL)
            if BK < H:
                _wait_previous(PDL)
            _swiglu_rows(x_ptr, ln_ptr, w_ptr, act_ptr, s, n, eps, H, I, BN, BK, BK >= H, PDL)
        else:
            _wait_previous(PDL)
            _launch_next(PDL)
            base = w_ptr + tl.load(ids_ptr + s).to(tl.int64) * swe
            _swiglu_rows(x_ptr, ln_ptr, base, act_ptr, s, n, eps, H, I, BN, BK, False, PDL)

    @triton.jit
    def _down_rows(act_ptr, base, s, n, nm, I: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   EARLY: tl.constexpr, PDL: tl.constexpr):
        """float32 [BN] = w2 rows n of the expert at `base` ([H, I]) . act[s]. EARLY (BK >= I, `base` known without
        the previous kernel's results): the rows are loaded first, then the program waits for the previous
        kernel; otherwise the caller has already waited and the rows stream in BK-wide chunks."""
        if EARLY:
            w = _tile(base + n * I, nm, I, BK)
            _wait_previous(PDL)
            k = tl.arange(0, BK)
            acc = _dot_rows(w, tl.load(act_ptr + s * I + k, mask=k < I, other=0.0).to(tl.float32))
        else:
            acc = tl.zeros([BN], dtype=tl.float32)
            for k0 in range(0, I, BK):
                k = k0 + tl.arange(0, BK)
                km = k < I
                av = tl.load(act_ptr + s * I + k, mask=km, other=0.0).to(tl.float32)
                w = tl.load(base + n[:, None] * I + k[None, :], mask=nm[:, None] & km[None, :], other=0.0)
                acc += tl.sum(w.to(tl.float32) * av[None, :], axis=1)
        return acc

    @triton.jit
    def _expert_down(act_ptr, ids_ptr, wts_ptr, w_ptr, x_ptr, ys_ptr, cnt_ptr, swe, SLOTS: tl.constexpr,
                     H: tl.constexpr, I: tl.constexpr, DENSE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PDL: tl.constexpr = False):
        """Program (block of BN output rows, slot): the slot's expert output round(w2[expert][n] . act[slot]) times
        its routing weight, into ys[slot, n]. The block's last slot to finish (a counter per block) adds the
        slots in slot order, rounds, and adds the sum to x[n] in place. DENSE: one slot, weight 1.
        With BK >= I the slot's rows are loaded before waiting for the previous kernel: the dense MLP's are fixed,
        and a routed step's expert ids are final when this kernel starts (the routed _expert_up lets it launch only
        after the router has finished); they are read past L1 (.cg), as _attention reads its early loads."""
        _launch_next(PDL)
        pid = tl.program_id(0)
        s = tl.program_id(1)
        n = pid * BN + tl.arange(0, BN)
        nm = n < H
        dt = x_ptr.dtype.element_ty
        if BK < I:
            _wait_previous(PDL)
        if DENSE:
            acc = _down_rows(act_ptr, w_ptr, s, n, nm, I, BN, BK, BK >= I, PDL)
            wt = 1.0
        else:
            expert = tl.load(ids_ptr + s, cache_modifier=".cg").to(tl.int64)
            acc = _down_rows(act_ptr, w_ptr + expert * swe, s, n, nm, I, BN, BK, BK >= I, PDL)
            wt = tl.load(wts_ptr + s)
        y = acc.to(dt).to(tl.float32) * wt  # each expert's output in the model dtype, then weighted
        if DENSE:
            xv = tl.load(x_ptr + n, mask=nm).to(tl.float32)
            tl.store(x_ptr + n, (xv + y.to(dt).to(tl.float32)).to(dt), mask=nm)
        else:
            tl.store(ys_ptr + s * H + n, y, mask=nm)
            if _last_to_arrive(cnt_ptr + pid, SLOTS):  # the last slot of this block: combine in slot order
                comb = tl.zeros([BN], dtype=tl.float32)
                for j in tl.static_range(SLOTS):
                    comb += tl.load(ys_ptr + j * H + n, mask=nm, other=0.0, cache_modifier=".cg")
                xv = tl.load(x_ptr + n, mask=nm).to(tl.float32)
                tl.store(x_ptr + n, (xv + comb.to(dt).to(tl.float32)).to(dt), mask=nm)
                tl.store(cnt_ptr + pid, 0)  # ready for the next layer / step

    @triton.jit
    def _attention(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr, o_ptr, n_splits, skh, skl, svh,
                   svl, scale, D: tl.constexpr, CHUNK: tl.constexpr, BS: tl.constexpr, PDL: tl.constexpr = False):
        """Program (head, chunk of CHUNK cache slots): flash-decoding partial (max, exp-sum, weighted V sum in
        float32) over the chunk's slots <= pos; the head's last chunk to finish merges them into o[head] (model
        dtype). Chunks past pos return at once.
        The q/k/v kernel before this one lets it launch only once every kernel before that has finished
        (_qkv_rope launches its successor after its own wait), so the position (written by the previous step's _choose) and the slots before it
        (written by earlier steps) are final: they are loaded before the wait; q and slot pos, which the q/k/v
        kernel writes, after it. Those early loads bypass L1 (.cg): the wait is what guarantees a fresh view of
        memory, so before it nothing an earlier kernel left in this SM's L1 may be read."""
        _launch_next(PDL)
        h = tl.program_id(0)
        sp = tl.program_id(1)
        pos = tl.load(pos_ptr, cache_modifier=".cg")
        active = pos // CHUNK + 1
        if sp < active:
            d = tl.arange(0, D)
            offs = sp * CHUNK + tl.arange(0, CHUNK)
            old = offs < pos
            kt = tl.load(k_ptr + h * skh + offs[:, None] * skl + d[None, :], mask=old[:, None], other=0.0,
                         cache_modifier=".cg")
            vt = tl.load(v_ptr + h * svh + offs[:, None] * svl + d[None, :], mask=old[:, None], other=0.0,
                         cache_modifier=".cg")
            _wait_previous(PDL)
            q = tl.load(q_ptr + h * D + d).to(tl.float32)
            new = (offs == pos)[:, None]
            kt = tl.where(new, tl.load(k_ptr + h * skh + pos * skl + d)[None, :], kt)
            vt = tl.where(new, tl.load(v_ptr + h * svh + pos * svl + d)[None, :], vt)
            valid = offs <= pos
            sc = tl.sum(kt.to(tl.float32) * q[None, :], axis=1) * scale
            sc = tl.where(valid, sc, float("-inf"))
            m = tl.max(sc, axis=0)  # finite: slot sp*CHUNK <= pos
            p = tl.exp(sc - m)
            idx = h * n_splits + sp
            tl.store(m_ptr + idx, m)
            tl.store(l_ptr + idx, tl.sum(p, axis=0))
            tl.store(acc_ptr + idx * D + d, tl.sum(p[:, None] * vt.to(tl.float32), axis=0))
            # _last_to_arrive written out: as a call inside this branch it compiles the 64- and 128-slot variants
            # with other registers and instructions than the code their memory.fused_attention table was timed on
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + h, 1, sem="acq_rel")
            if done == active - 1:
                sidx = tl.arange(0, BS)
                ok = sidx < active
                ms = tl.load(m_ptr + h * n_splits + sidx, mask=ok, other=float("-inf"), cache_modifier=".cg")
                ls = tl.load(l_ptr + h * n_splits + sidx, mask=ok, other=0.0, cache_modifier=".cg")
                w = tl.exp(ms - tl.max(ms, axis=0))
                accs = tl.load(acc_ptr + (h * n_splits + sidx)[:, None] * D + d[None, :], mask=ok[:, None],
                               other=0.0, cache_modifier=".cg")
                out = tl.sum(w[:, None] * accs, axis=0) / tl.sum(w * ls, axis=0)
                tl.store(o_ptr + h * D + d, out.to(o_ptr.dtype.element_ty))
                tl.store(cnt_ptr + h, 0)

    @triton.jit
    def _lm_head(x_ptr, ln_ptr, w_ptr, logits_ptr, stamp_ptr, serial_ptr, pmax_ptr, parg_ptr, eps, V,
                 H: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
        """float32 logits of BN tokens (the projection rounded to the model dtype first, like the reference),
        and this block's best token once the n-gram ban (stamp == serial) is applied."""
        _after_predecessor(PDL)
        pid = tl.program_id(0)
        n = pid * BN + tl.arange(0, BN)
        nm = n < V
        acc = _normed_gemv(x_ptr, ln_ptr, w_ptr + n.to(tl.int64) * H, nm, eps, H, BN, BK)
        lg = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(logits_ptr + n, lg, mask=nm)
        _block_best(lg, pid * BN, n, nm, stamp_ptr, serial_ptr, pmax_ptr + pid, parg_ptr + pid)

    @triton.jit
    def _block_best(lg, start, n, nm, stamp_ptr, serial_ptr, max_ptr, arg_ptr):
        """The largest of float32 logits lg of tokens n = start + 0.. (masked by nm) not banned this step
        (stamp[token] == serial) into max_ptr, its token (the first of equal maxima, like torch.argmax) into
        arg_ptr."""
        serial = tl.load(serial_ptr)
        banned = tl.load(stamp_ptr + n, mask=nm, other=-1) == serial
        s = tl.where(nm & ~banned, lg, float("-inf"))
        tl.store(max_ptr, tl.max(s, axis=0))
        tl.store(arg_ptr, start + tl.argmax(s, axis=0))

    @triton.jit
    def _blocks_best(pmax_ptr, parg_ptr, P, BP: tl.constexpr):
        """The greedy token over P blocks' best (pmax, parg): the first block among equal maxima holds the first
        index overall (torch.argmax's). No pmax may be NaN (it equals no maximum)."""
        i = tl.arange(0, BP)
        ok = i < P
        m = tl.load(pmax_ptr + i, mask=ok, other=float("-inf"))
        best = tl.max(m, axis=0)
        first = tl.min(tl.where(ok & (m == best), i, BP), axis=0)
        return tl.load(parg_ptr + first)

    @triton.jit
    def _ngram_ban(hist_ptr, pos_ptr, stamp_ptr, serial_ptr, s_hist, s_stamp, N: tl.constexpr, BW: tl.constexpr,
                   PDL: tl.constexpr = False):
        """HF no_repeat_ngram_size over history[0..pos]: every window whose first N-1 tokens equal the last N-1
        bans its N-th token (stamp[token] = serial, read by _lm_head in the same step). Program (w, row): row's
        history and stamps start s_hist and s_stamp elements further (the batched choice, choice_kernels.py;
        the fused batch-1 step launches one row)."""
        _after_predecessor(PDL)
        row = tl.program_id(1)
        hist_ptr += row * s_hist
        stamp_ptr += row * s_stamp
        pos = tl.load(pos_ptr)
        serial = tl.load(serial_ptr)
        length = pos + 1
        w = tl.program_id(0) * BW + tl.arange(0, BW)  # window starts
        valid = w <= length - N
        hit = valid
        for i in tl.static_range(N - 1):
            a = tl.load(hist_ptr + w + i, mask=valid, other=0)
            b = tl.load(hist_ptr + length - N + 1 + i, mask=length >= N, other=-1)  # no window when shorter
            hit = hit & (a == b)
        tok = tl.load(hist_ptr + w + N - 1, mask=hit, other=0)
        tl.store(stamp_ptr + tok, serial, mask=hit)

    @triton.jit
    def _choose(pmax_ptr, parg_ptr, P, token_ptr, hist_ptr, pos_ptr, serial_ptr, capacity, BP: tl.constexpr,
                PDL: tl.constexpr = False):
        """Greedy choice over the blocks' best tokens (the first index among equal maxima, like argmax); writes
        the token as the next step's input and into history[pos + 1]; advances the ban serial and the position
        (so the host launches the next step's graph without setting anything)."""
        _after_predecessor(PDL)
        tok = _blocks_best(pmax_ptr, parg_ptr, P, BP)
        tl.store(token_ptr, tok)
        nxt = tl.load(pos_ptr) + 1
        tl.store(hist_ptr + nxt, tok, mask=nxt < capacity)
        tl.store(serial_ptr, tl.load(serial_ptr) + 1)
        tl.store(pos_ptr, nxt)


# Per kernel: (rows per program, reduction chunk, warps): the best of benchmarks/decode_kernels_tune.py on an H200
# (2026-11-21), except the router's warps (4: 0.580 ms per token in the full step against 0.594 ms with the tuned 2)
# and the shared experts' blocks: whole rows, so their weights load before the wait (benchmarks/decode_b1_variants.py,
# H100, 2026-11-27: 0.6241 ms per token against 0.6413 with 8 rows in 256-wide chunks, which wait first).
BLOCKS = {
    "qkv": (2, 2048, 4),  # rotation pairs per program
    "oproj": (2, 2048, 8),
    "router": (1, 2048, 4),  # experts per program (the warps also serve "shared_up")
    "shared_up": (4, 2048, 0),  # the shared pseudo-experts' SwiGLU, inside the router's launch
    "up": (8, 256, 8),
    "down": (16, 1024, 8),  # whole rows: loaded before the wait
    "attention": (32, 0, 1),  # cache slots per program (1 warp, though its early keys and values spill: 0.6124 ms
    # per token against 0.6182 with 2 warps and 0.6295 with 4, benchmarks/decode_b1_variants.py, H100, 2026-11-27)
    "dense_up": (4, 2048, 4),
    "dense_down": (2, 8192, 8),
    "lm_head": (128, 128, 4),
    "ban": (256, 0, 4),  # windows per program
}
# The attention's blocks by the cache length its graph is captured for (the bucket's end): BLOCKS["attention"] up to
# 1,024 slots, then more slots and warps a program, so that a long cache has about as many programs as a short one,
# each with more loads in flight. On an H200 (benchmarks/decode_b1_variants.py --text-tokens 2000, 2026-11-27) 32
# slots on one warp streamed a 2,700-slot cache at 0.77 TB/s, and 128 slots on 4 warps ran the step 17% faster; at
# 800 slots those were 3% slower. Measured again at four lengths in between (2026-11-28, H200, 256 steps from 943,
# 1,393, 1,893 and 2,393 cached slots; docs/fast-mode.md): each length's fastest blocks are the ones this rule picks,
# or within 1% of them.
ATTENTION_BY_LENGTH = ((1024, BLOCKS["attention"]), (2048, (64, 0, 2)), (None, (128, 0, 4)))


def attention_blocks(length: int) -> tuple[int, int, int]:
    """(cache slots per program, unused, warps) of the fused attention over a cache of `length` slots."""
    return next(blocks for upto, blocks in ATTENTION_BY_LENGTH if upto is None or length <= upto)


def attention_table_slots() -> list[int]:
    """The cache lengths `memory.fused_attention` is measured at: 16 to 16,384 slots by fours, plus each block
    change's last length on the shorter blocks and a quarter past it on the longer ones, so that the time model
    interpolates across a change of blocks only within the quarter past it (the step between 1,024 and 2,048 slots
    was 3-9% faster than its neighbours' blocks on an H200). The plan looks a step up by its position, the engine
    picks blocks by the bucket's end: with the default 256-slot buckets positions 1,025-1,279 run the longer blocks
    and are priced between a length on each (1,024 and 1,280)."""
    edges = [n for upto, _ in ATTENTION_BY_LENGTH if upto for n in (upto, upto * 5 // 4)]
    return sorted({4 ** i for i in range(2, 8)} | set(edges))


class FusedDecode:
    """Static buffers and kernel launches of the fused batch-1 step over one static cache (graph-capturable:
    no allocation outside the attention's scratch, no host sync). `step(...)` runs embedding, every layer and
    the lm_head; with `choose` it also applies the n-gram ban, writes the greedy token as the next input and
    advances the position (so a graph of several steps runs them in a row, and must run once per call)."""

    def __init__(self, weights, cfg, vocab: int, device, dtype, blocks: dict | None = None, pdl: bool = False):
        import torch

        self.w, self.cfg, self.vocab = weights, cfg, vocab
        self.pdl = bool(pdl)  # programmatic dependent launch (sm90+): see _after_predecessor
        self.blocks = {**BLOCKS, **(blocks or {})}
        # the attention's blocks follow the cache length (attention_blocks) unless `blocks` fixes them
        self.fixed_attention = tuple((blocks or {})["attention"]) if "attention" in (blocks or {}) else None
        hd = cfg.hidden
        self.x = torch.empty(1, hd, dtype=dtype, device=device)
        self.q = torch.empty(1, cfg.heads, cfg.head_dim, dtype=dtype, device=device)
        self.router_logits = torch.empty(cfg.n_routed, dtype=torch.float32, device=device)
        slots = cfg.k + cfg.shared_slots
        self.ids = torch.zeros(slots, dtype=torch.int32, device=device)  # each slot's expert, from _router
        self.wts = torch.zeros(slots, dtype=torch.float32, device=device)  # and its routing weight
        self.router_count = torch.zeros(1, dtype=torch.int32, device=device)
        self.ys = torch.empty(slots, hd, dtype=torch.float32, device=device)  # per-slot expert outputs
        self.down_count = torch.zeros(hd, dtype=torch.int32, device=device)  # arrivals per row block
        self.o = torch.empty(1, cfg.heads, cfg.head_dim, dtype=dtype, device=device)
        self.attn_count = torch.zeros(cfg.heads, dtype=torch.int32, device=device)
        self._attn_scratch: dict[int, tuple] = {}
        self.act = torch.empty(max(slots * cfg.moe_inter, cfg.inter), dtype=dtype, device=device)
        self.n_head_blocks = triton.cdiv(vocab, self.blocks["lm_head"][0])
        self.pmax = torch.empty(self.n_head_blocks, dtype=torch.float32, device=device)
        self.parg = torch.empty(self.n_head_blocks, dtype=torch.int32, device=device)
        self.stamp = torch.full((vocab,), -1, dtype=torch.long, device=device)
        self.serial = torch.zeros(1, dtype=torch.long, device=device)
        for t in [weights.embed, weights.lm_head] + [p for lw in weights.layers
                                                      for p in (lw.wqkv, lw.wo, lw.w13, lw.w2)]:
            if not t.is_contiguous():
                raise ValueError("the fused decode kernels need contiguous weights")

    def step(self, st, length: int, cos_t, sin_t, choose: bool = False, ngram: int = 0) -> None:
        """One token for the state's single row (st.token) at position st.pos, attending over cache slots
        < length, with RoPE tables cos_t/sin_t [positions, d]; float32 logits into st.logits [1, V]."""
        import torch

        cfg, w, x, blk = self.cfg, self.w, self.x, self.blocks
        hd, d = cfg.hidden, cfg.head_dim
        kh = next_pow2(hd)  # a chunk as wide as the whole (padded) row: every load issued at once
        # every kernel but the step's first launches dependent: the first keeps plain stream order after
        # whatever came before it (nothing, another graph, or the previous step's last kernel)
        first = {"PDL": self.pdl}
        dep = {"PDL": True, "launch_pdl": True} if self.pdl else {}

        if choose and ngram > 0:
            bw, _, warps = blk["ban"]
            _ngram_ban[(triton.cdiv(st.capacity, bw),)](st.history, st.pos, self.stamp, self.serial,
                                                        st.history.stride(0), self.stamp.stride(0), N=ngram, BW=bw,
                                                        num_warps=warps, **first)
            first = dep
        br, bkq, wq = blk["qkv"]
        br = min(br, d // 2)
        for i, lw in enumerate(w.layers):
            kc, vc = st.cache.layer_keys(i), st.cache.layer_values(i)
            _qkv_rope[(3 * cfg.heads * (d // 2) // br,)](
                x, lw.ln1, lw.wqkv, cos_t, sin_t, st.pos, self.q, kc, vc, st.token, w.embed, kc.stride(1),
                kc.stride(2), vc.stride(1), vc.stride(2), cfg.eps, H=hd, D=d, BR=br, BK=min(bkq, kh), EMBED=i == 0,
                num_warps=wq, **(first if i == 0 else dep))
            o = self._attend(kc, vc, st.pos, length, dep)
            bn, bk, wn = blk["oproj"]
            _oproj_residual[(triton.cdiv(hd, bn),)](o, lw.wo, x, H=hd, BN=bn, BK=min(bk, kh), num_warps=wn, **dep)
            if lw.moe:
                e = cfg.n_routed
                be, bk, wn = blk["router"]
                inner, slots, swe_up, swe_down = cfg.moe_inter, cfg.k + cfg.shared_slots, lw.w13.stride(0), \
                    lw.w2.stride(0)
                up, down = blk["up"], blk["down"]
                bn_up, bk_up, _ = blk["shared_up"]
                _router[(triton.cdiv(e, be) + cfg.shared_slots * triton.cdiv(inner, bn_up),)](
                    x, lw.ln2, lw.gate, self.router_logits, self.router_count, self.ids, self.wts, lw.w13, self.act,
                    cfg.eps, cfg.scale, swe_up, E=e, EP=next_pow2(e), K=cfg.k, SHARED=cfg.shared_slots,
                    NORM=cfg.norm_topk_prob, H=hd, I=inner, BE=be, BK=min(bk, kh), BN_UP=bn_up,
                    BK_UP=min(bk_up, kh), num_warps=wn, **dep)
                routed = cfg.k
            else:
                inner, slots, swe_up, swe_down = cfg.inter, 1, 0, 0
                up, down = blk["dense_up"], blk["dense_down"]
                routed = 1
            _expert_up[(routed, triton.cdiv(inner, up[0]))](
                x, lw.ln2, self.ids, lw.w13, self.act, cfg.eps, swe_up, H=hd, I=inner, DENSE=not lw.moe,
                BN=up[0], BK=min(up[1], kh), num_warps=up[2], **dep)
            _expert_down[(triton.cdiv(hd, down[0]), slots)](
                self.act, self.ids, self.wts, lw.w2, x, self.ys, self.down_count, swe_down, SLOTS=slots, H=hd,
                I=inner, DENSE=not lw.moe, BN=down[0], BK=min(down[1], next_pow2(inner)), num_warps=down[2], **dep)
        bn, bk, wn = blk["lm_head"]
        _lm_head[(self.n_head_blocks,)](x, w.norm, w.lm_head, st.logits, self.stamp, self.serial, self.pmax,
                                        self.parg, cfg.eps, self.vocab, H=hd, BN=bn, BK=min(bk, kh), num_warps=wn,
                                        **dep)
        if choose:
            _choose[(1,)](self.pmax, self.parg, self.n_head_blocks, st.token, st.history, st.pos, self.serial,
                          st.capacity, BP=next_pow2(self.n_head_blocks), num_warps=8, **dep)

    def _attend(self, kc, vc, pos, length: int, launch: dict):
        """Attention of self.q over cache slots <= pos (grid sized for the bucket length) -> self.o."""
        import torch

        d = self.cfg.head_dim
        chunk, _, warps = self.fixed_attention or attention_blocks(length)
        splits = triton.cdiv(length, chunk)
        if splits not in self._attn_scratch:
            n = self.cfg.heads * splits
            dev = self.q.device
            self._attn_scratch[splits] = (torch.empty(n, device=dev), torch.empty(n, device=dev),
                                          torch.empty(n, d, device=dev))
        m, l, acc = self._attn_scratch[splits]
        _attention[(self.cfg.heads, splits)](self.q, kc, vc, pos, m, l, acc, self.attn_count, self.o, splits,
                                             kc.stride(1), kc.stride(2), vc.stride(1), vc.stride(2), d ** -0.5,
                                             D=d, CHUNK=chunk, BS=next_pow2(splits), num_warps=warps, **launch)
        return self.o
