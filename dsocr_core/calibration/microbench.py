"""Kernel microbenchmarks over kernel shape grids (never the model's stages), written into a calibration profile
(the ops and their timing are in ops.py).

Tables (profile.py names them): GEMM efficiency by M, N, K per dtype; memory-bound kernels by bytes moved (copy,
elementwise add, LayerNorm, GEMV); SAM's dense bias (its broadcast sum and strided copy) by attended squares x
side; attention by implementation (sdpa with the LM's backends, sdpa with a dense additive mask as SAM runs it,
the reference's eager softmax attention, flash) over heads x query x key x head dim,
and causal over heads x length x head dim; grouped expert GEMMs (torch._grouped_mm, or bmm where it cannot run)
by tokens per expert x N x K; and the per-launch costs: an empty kernel inside a CUDA graph, an eager launch
queued behind a busy GPU, the host time of one eager op, a host synchronisation, a graph replay's host time.

Timing on a GPU: each shape is captured N times in one CUDA graph over rotating inputs (enough copies to spill
the L2 cache, so weights come from DRAM as in the model) and the replay is timed with CUDA events: device time
per kernel, gaps included; the kernel's launch gap (the graph-kernel cost times its kernels) is subtracted, so a
table holds work time and the time model adds launches x the mode's per-launch cost back. On a CPU the same code
times eager calls with perf_counter (the tests run it with tiny shapes: `--device cpu --quick`).

Shapes above a work or memory cap, and shapes left when the time budget runs out, are not measured: they take
the value of the nearest measured shape of the same table (marked `measured: false` in the profile).
"""
from __future__ import annotations

import itertools
import time
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from ..spec import ModelSpec
from .ops import (FUSED_ATTN_SLOT_BYTES, GROUP_BYTES_PER_ROW, GROUP_SLOTS, GROUPED_EXPERTS, MOE_EXPERT_BYTES,
                  Settings, input_bytes, kernel_count, launch_costs, measure_entry)
from .profile import (ADDABLE_LAUNCH, BIAS_KINDS, CEILING_RANGES, DTYPE_KINDS, LAUNCH_COMPANIONS, LAUNCH_KEYS,
                      MAX_EFFICIENCY, Profile, add_tables, build_profile, entry_work, table_axes, table_kind)

Progress = Callable[[int, int, str], None]  # (entries done, entries planned, what ran last)
# the memory tables measured over the bytes grid in every calibration (the fused kernels' tables have their own)
BYTE_KINDS = ("copy", "elementwise", "norm", "gemv", "transposed_cat", "projector_cat", "gather_rows", "permuted_copy",
              "permuted_add", "cast", "broadcast", "index_put")


def grids(quick: bool, device: str) -> dict[str, dict[str, list[float]]]:
    """The shape grid of every table (the full grid on a GPU, a tiny one with quick or on a CPU)."""
    if quick:
        g = {"m": [1, 16, 128], "n": [16, 128], "k": [16, 128]}
        att = {"bh": [1, 4], "q": [1, 64], "k": [16, 64], "d": [16, 64]}
        causal = {"bh": [1, 4], "s": [16, 64], "d": [32]}
        out = {"gemm.bfloat16": g, "gemm.float32": g}
        out |= {f"memory.{k}": {"bytes": [4096, 65536, 1 << 20]} for k in BYTE_KINDS}
        out |= {f"bias.{k}": {"bh": [12, 48], "side": [4, 14]} for k in BIAS_KINDS}
        for impl in ("sdpa", "eager"):  # no flash table: predictions fall back to sdpa, and say so
            out[f"attention.{impl}"] = att
            out[f"attention.{impl}.causal"] = causal
        out["attention.sdpa_bias"] = {"bh": [1, 4], "q": [16, 64], "k": [16, 64], "d": [32]}
        out["grouped_gemm.bfloat16"] = {"tokens": [1, 8], "n": [64], "k": [64]}
        out["conv.bfloat16"] = {"m": [16, 64], "n": [16], "k": [48]}
        out["linear.bfloat16"] = {"m": [16, 64], "n": [16], "k": [48]}
        return out
    gemm = {"m": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536], "n": [16, 64, 256, 1024, 4096, 16384, 131072],
            "k": [64, 256, 1024, 4096, 16384]}
    small = {"m": [1, 16, 256, 4096, 65536], "n": [64, 1024, 16384, 131072], "k": [256, 1024, 4096]}
    att = {"bh": [1, 8, 64, 512, 4096], "q": [1, 16, 256, 1024, 4096], "k": [16, 256, 1024, 4096, 16384],
           "d": [64, 128, 256]}
    causal = {"bh": [1, 8, 64, 512], "s": [16, 256, 1024, 4096, 8192], "d": [64, 128, 256]}
    out = {"gemm.bfloat16": gemm}
    out |= {f"memory.{k}": {"bytes": [float(4 ** i) for i in range(6, 17)]} for k in BYTE_KINDS}
    # SAM's windows (side 14), 640, 1024 and 1280 px global grids (40, 64, 80); bh = views x windows x heads, so at
    # least SAM's 12 heads (at bh 1 the reshape is a view: no copy to time, the entry would stay unmeasured)
    out |= {f"bias.{k}": {"bh": [12, 48, 192, 768, 3072, 12288], "side": [14, 40, 64, 80]} for k in BIAS_KINDS}
    out |= {"attention.sdpa": att, "attention.sdpa.causal": causal,
            # the LM's expert GEMMs (gate/up n 1,792 k 1,280; down n 1,280 k 896) on grid lines of their own. Above
            # 128 rows per expert the kernel runs whole tiles of 256 rows (flat from 129 to 256 rows, 1.6x at 257 on
            # an H200: benchmarks/grouped_gemm_steps.py); the fast plan prices a group at its rows in whole tiles
            # (fast/plan.tiled_rows), so the grid above 128 holds whole tiles only: a size between them would be
            # timed with its padding, which the plan already charges
            "grouped_gemm.bfloat16": {"tokens": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048,
                                                 3072, 4096],
                                      "n": [256, 1024, 1280, 1792, 4096], "k": [256, 896, 1024, 1280, 4096]},
            "attention.flash": att, "attention.flash.causal": causal,
            # the fast engine's SAM (its folded q/k head dim is 92 to 224), CLIP and LM prefill
            "attention.default": {**att, "d": [64, 128, 192, 256]},
            # the LM prefill's causal SDPA (bh = batch x 10 heads, s = a page's tokens): grid lines 2x apart where
            # the prefill runs, since 4-8x steps missed it by up to 40% between them (docs/accuracy.md, "The LM
            # attention's kernels add up")
            "attention.default.causal": {"bh": [1, 4, 16, 32, 64, 128, 256, 512, 1024],
                                         "s": [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192], "d": [64, 128, 256]},
            "attention.sdpa_bias": {"bh": [1, 8, 64, 512, 4096], "q": [16, 256, 1024, 4096],
                                    "k": [16, 256, 1024, 4096], "d": [64, 128, 256]},
            "attention.eager": {"bh": [1, 8, 64, 512], "q": [1, 16, 256, 1024, 4096], "k": [16, 256, 1024, 4096],
                                "d": [64, 128]},
            "attention.eager.causal": {"bh": [1, 8, 64], "s": [16, 256, 1024, 4096], "d": [64, 128]},
            "gemm.float32": small, "gemm.float16": small,
            # SAM's patch embedding conv (3 -> 768 channels, 16 x 16 patches): one view's 1,024 to 6,400 positions up
            "conv.bfloat16": {"m": [256, 1024, 4096, 16384, 65536, 262144], "n": [768], "k": [768]},
            "linear.bfloat16": projector_linear_grid()}
    if device.startswith("cuda"):  # the fused batch-1 decode kernels (Triton; a GPU only): weight GEMVs from
        # 0.3 MB (a router) to 331 MB (the lm_head), attention over 16 to 16,384 cached tokens
        out["memory.fused_gemv"] = {"bytes": [float(4 ** i) for i in range(9, 15)] + [float(1 << 29)]}
        # the lm_head kernel: 1 MB to 512 MB, and DeepSeek-OCR's own lm_head (vocabulary x hidden, bf16: 331 MB)
        spec = ModelSpec()
        head = float(spec.vocab_size * spec.hidden_size * 2)
        out["memory.fused_lm_head"] = {"bytes": sorted([float(4 ** i) for i in range(10, 15)] + [head, float(1 << 29)])}
        from ..fast.decode_kernels import attention_table_slots  # the engine's blocks change with the length

        out["memory.fused_attention"] = {"bytes": [float(FUSED_ATTN_SLOT_BYTES * s) for s in attention_table_slots()]}
        # the batched decode attention (Triton split-KV): batch x 10 heads over 16 to 8,192 cached tokens; the flash
        # table it was priced on before ran 8-11% faster than it at batch 8-16 with 2,193 cached tokens (an H100
        # trace: docs/results/h100_decode_long_context_2026-11-27/)
        # and by the fill, the position's share of the static cache: the engine's cache ends at a bucket's end
        # (fast/options.bucket, 256 slots), and the kernel's grid covers every chunk of it; the chunks past the
        # position load nothing but still run (a batch of 57 at 146 cached tokens took 28 us a layer on an H200
        # where the table at a full cache says 21: docs/results/h200_moe_decode_tiles_2026-11-28/)
        out["attention.split_kv"] = {"bh": [10, 20, 40, 80, 160, 320, 640], "q": [1],
                                     "k": [16, 128, 512, 1024, 2048, 4096, 8192], "d": [128],
                                     "fill": [0.25, 0.5, 0.75, 1.0]}
        # the by-expert MoE kernels of batched decode over 1 to 66 distinct experts (6.9 to 454 MB)
        # and by the kernels' token tile (fast/options.expert_token_tile: every program loads and multiplies the
        # whole [rows, tile] block, so at 64 tokens a launch takes longer than at 8 over the same experts)
        out["memory.moe_gemv"] = {"bytes": [float(MOE_EXPERT_BYTES * n) for n in (1, 2, 4, 8, 16, 32, 66)],
                                  "tokens": [16.0, 32.0, 64.0]}
        out["memory.moe_gemv_combine"] = dict(out["memory.moe_gemv"])  # the same with the combine + residual
        # the MoE's grouping kernels over the rows of 16 to 131,072 tokens (its one-hot work, 128 KB to 1 GB)
        out["memory.group_rows"] = {"bytes": [float(GROUP_BYTES_PER_ROW * GROUP_SLOTS * t)
                                              for t in (16, 128, 1024, 4096, 16384, 65536, 131072)]}
    return out


def projector_linear_grid(dense_up_to: int = 4096, top: int = 65536) -> dict[str, list[float]]:
    """The linear table's grid: every family's projector (n = its hidden size, k = its projector input) over the
    row counts pages give, each view size's whole multiples up to `dense_up_to` rows (a batch's globals or tiles
    go through one call: any count of views; cuBLAS changes kernel and wave count between such neighbours), then
    steps of 2^(1/2) up to `top` rows, where the GEMM is compute-bound and smooth."""
    from ..analytic.vision import sam_out_side  # the rows a view gives, as the plans count them
    from ..registry import FAMILIES

    n, k, rows = set(), set(), set()
    for family in FAMILIES.values():
        spec = family.preset("full")
        n.add(spec.hidden_size)
        k.add(spec.projector_input_dim)
        for side in {s for mode in family.modes.values() for s in (mode.base_size, mode.tile_size)}:
            f = sam_out_side(spec, side) ** 2
            rows.update(range(f, dense_up_to + 1, f))
    steps = int(round(2 * np.log2(top / dense_up_to)))
    rows.update(int(round(dense_up_to * 2 ** (i / 2))) for i in range(1, steps + 1))
    return {"m": [float(r) for r in sorted(rows)], "n": [float(v) for v in sorted(n)],
            "k": [float(v) for v in sorted(k)]}


# ---------------------------------------------------------------------------------------------- the sweep
def _entries(name: str, axes: dict) -> list[tuple[tuple[int, ...], dict]]:
    names = table_axes(name)
    out = []
    for idx in itertools.product(*(range(len(axes[a])) for a in names)):
        out.append((idx, {a: float(axes[a][i]) for a, i in zip(names, idx)}))
    return out


def _too_big(name: str, coords: dict, st: Settings) -> bool:
    flops, nbytes = entry_work(name, coords, {"experts": st.experts})
    _, _, set_bytes, _ = input_bytes(name, coords, st)
    return float(flops) > st.flops_cap or set_bytes > st.memory_cap / 2 or float(nbytes) > 4 * st.memory_cap


def _fill(measured: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Entries not measured take the value of the nearest measured entry (L1 distance in grid steps; ties: the
    one with the larger shape, since unmeasured entries are the largest or the last)."""
    out = values.copy()
    have = np.argwhere(measured)
    for idx in np.argwhere(~measured):
        dist = np.abs(have - idx).sum(1)
        best = np.flatnonzero(dist == dist.min())
        pick = have[best[np.argmax(have[best].sum(1))]]
        out[tuple(idx)] = values[tuple(pick)]
    return out


def run_microbench(device: str = "cuda", quick: bool = False, budget_s: float = 300.0,
                   progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                   tables: list[str] | None = None, add_to: Profile | None = None, passes: int = 1) -> Profile:
    """Run every table's grid (or `tables` only) within `budget_s` seconds and return the profile; with `add_to`
    (a profile of the same GPU model), the tables measured against its ceilings, added to it (profile.add_tables).
    A profile of its own needs a GEMM table. `passes` > 1 measures every entry again, every other pass in reverse
    order, and keeps its lowest time (noise and a slow moment only add time; one pass once left an H100 entry at
    twice its neighbours, docs/accuracy.md "The projector's GEMM at its own shape"); the tables' meta and the
    profile's notes say how far the passes differed."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    import torch

    from ..measure.environment import capture_environment

    start = time.perf_counter()
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("calibrate --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
                           "use --device cpu for a CPU profile")
    if not cuda and device != "cpu":
        raise ValueError(f"unsupported device {device!r}; use cuda, cuda:N or cpu")
    if cuda:
        props = torch.cuda.get_device_properties(device)
        free, _ = torch.cuda.mem_get_info(device)
        dev_info = {"name": torch.cuda.get_device_name(device), "kind": "cuda",
                    "sm_count": int(props.multi_processor_count), "memory_gb": props.total_memory / 1e9,
                    "l2_bytes": int(getattr(props, "L2_cache_size", 50 << 20))}
        st = Settings(device, quick, budget_s, flops_cap=2e11 if quick else 4e12,
                      memory_cap=min(8e9, 0.3 * free), target_s=5e-4 if quick else 2e-3,
                      repeats=3 if quick else 5, max_inner=50 if quick else 200, l2_bytes=dev_info["l2_bytes"])
    else:
        import os
        import platform

        dev_info = {"name": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)",
                    "kind": "cpu", "sm_count": None, "memory_gb": None, "l2_bytes": None}
        st = Settings(device, quick, budget_s, flops_cap=5e7 if quick else 5e9, memory_cap=64e6 if quick else 1e9,
                      target_s=2e-4 if quick else 5e-3, repeats=2 if quick else 3, max_inner=8 if quick else 50,
                      l2_bytes=1 << 20, experts=4 if quick else GROUPED_EXPERTS)
    if quick and cuda:
        st.experts = 8
    launch = launch_costs(st, host_stages=tables is None or "launch.host_stages" in tables)
    gap = launch["graph_kernel_s"] if cuda else launch["eager_kernel_s"]
    plan = grids(quick, device)
    if tables is not None:
        plan = {k: v for k, v in plan.items() if k in tables}
    jobs = [(name, idx, c) for name, axes in plan.items() for idx, c in _entries(name, axes)]
    shape = lambda n: tuple(len(plan[n][a]) for a in table_axes(n))  # noqa: E731
    times = {n: np.full(shape(n) + (passes,), np.nan) for n in plan}  # per call, launch gaps included, each pass
    failed: dict[str, str] = {}
    skipped = {"cap": 0, "budget": 0, "error": 0}
    stopped, done, errored = False, 0, set()
    reached = [0] * passes  # entries each pass reached before the budget or a stop ended it
    for p in range(passes):  # the budget covers every pass; a later pass only measures again
        for name, idx, coords in (jobs if p % 2 == 0 else jobs[::-1]):
            done += 1
            if should_stop is not None and should_stop():
                stopped = True
            ended = stopped or time.perf_counter() - start > budget_s  # and stays so: the rest are not reached
            reached[p] += not ended
            if ended:
                skipped["budget"] += p == 0
            elif _too_big(name, coords, st):
                skipped["cap"] += p == 0
            elif (name, idx) not in errored:
                try:
                    times[name][idx + (p,)] = measure_entry(name, coords, st)
                except Exception as exc:  # an unsupported kernel (flash on a CPU) or an out-of-memory
                    errored.add((name, idx))  # not measured again: what an earlier pass measured stays
                    if p == 0:
                        skipped["error"] += 1
                        failed.setdefault(name, f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
                    if cuda:
                        torch.cuda.empty_cache()
            if progress is not None:
                progress(done, len(jobs) * passes, name)
    for p in range(1, passes):
        if reached[p] < len(jobs):
            st.notes.append(f"pass {p + 1} of {passes} ended early (the budget ran out, or a stop) after {reached[p]} "
                            f"of {len(jobs)} entries; the entries it did not reach keep the earlier passes' times")
    raw: dict[str, np.ndarray] = {}
    for name, t in times.items():  # the lowest time of the passes (NaN: none), less the launch gaps: the work time
        low = np.fmin.reduce(t, axis=-1)
        raw[name] = np.maximum(low - kernel_count(name) * gap, 0.05 * low)
    if cuda:
        torch.cuda.empty_cache()
    if add_to is None and not any(np.isfinite(t).any() for n, t in raw.items() if n.startswith("gemm.")):
        raise RuntimeError(f"calibration measured no GEMM shape (budget {budget_s:g} s, skipped {skipped}, "
                           f"failures {failed or 'none'}); a profile needs at least one GEMM table")
    ceilings = add_to.raw["ceilings"] if add_to is not None else _ceilings(dev_info, raw, plan, st)
    too_slow = [f"{key} {ceilings[key]:.3g} (a profile's floor: {low:g})"
                for key, (low, _) in CEILING_RANGES.items() if ceilings[key] < low]
    if too_slow:  # a stop or a budget after a few tiny shapes (or a machine busy with other work): no peak seen
        ended = "was stopped" if stopped else ("ran out of budget" if skipped["budget"] else "finished")
        advice = ("let it measure larger shapes (a longer budget, no early stop)" if stopped or skipped["budget"]
                  else "run it again")
        raise RuntimeError(f"calibration {ended} after {sum(int(np.isfinite(t).sum()) for t in raw.values())} "
                           f"shapes, and the best rates they reached are below what a real device does: "
                           f"{', '.join(too_slow)}; ceilings set from them would be meaningless. Nothing saved: "
                           f"{advice} on a machine not busy with other work")
    out_tables = {}
    for name, t_work in raw.items():
        measured = np.isfinite(t_work)
        if not measured.any():
            st.notes.append(f"{name}: nothing measured ({failed.get(name, 'over the caps or the budget')})")
            continue
        meta = {"dtype": name.split(".")[1] if table_kind(name) in DTYPE_KINDS else "bfloat16",
                "launch_gap_subtracted_s": gap, "kernels_per_call": kernel_count(name)}
        if table_kind(name) == "grouped_gemm":
            meta["experts"] = st.experts
        axes = {a: list(plan[name][a]) for a in table_axes(name)}
        if passes > 1:
            meta |= _pass_spread(name, times[name], axes, st.notes)
        mesh = np.meshgrid(*[np.asarray(v, dtype=float) for v in axes.values()], indexing="ij")
        flops, nbytes = entry_work(name, dict(zip(axes, mesh)), meta)
        roof = np.maximum(flops / ceilings["flops_per_s"], nbytes / ceilings["bytes_per_s"])
        eff = np.where(measured, roof / np.where(measured, t_work, 1.0), np.nan)
        too_fast = measured & (eff > MAX_EFFICIENCY)
        if too_fast.any():  # e.g. data resident in a cache larger than it: not a rate the model can use
            st.notes.append(f"{name}: {int(too_fast.sum())} shapes ran up to {float(np.nanmax(eff)):.3g}x the "
                            "roofline on the ceilings (cache-resident?); left unmeasured, filled from neighbours")
            measured = measured & ~too_fast
            if not measured.any():
                continue
        eff = _fill(measured, np.clip(eff, 1e-9, MAX_EFFICIENCY))
        out_tables[name] = {"axes": axes, "efficiency": eff.tolist(), "measured": measured.tolist(), "meta": meta}
    elapsed = time.perf_counter() - start
    versions = _versions()
    env = capture_environment(device)
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if add_to is not None:
        asked = {name: key for name, key in ADDABLE_LAUNCH.items() if name in (tables or ())}
        launch_added = {key: launch[key] for key in asked.values() if key in launch}
        launch_added.update({c: launch[c] for key in launch_added for c in LAUNCH_COMPANIONS.get(key, ())
                             if c in launch})  # the host's speed they were measured at
        missed = [name for name, key in asked.items() if key not in launch]
        if missed:  # e.g. the model's host costs on a CPU or in a quick run, or a failure the notes name
            raise RuntimeError(f"calibration could not measure {', '.join(missed)}: "
                               f"{'; '.join(st.notes) or 'a CPU or a quick calibration measures no host costs'}")
        if not out_tables and not launch_added:
            raise RuntimeError(f"calibration measured none of {', '.join(plan)} (skipped {skipped}, failures "
                               f"{failed or 'none'})")
        return add_tables(add_to, out_tables, dev_info, env, versions, created, quick, launch=launch_added,
                          notes=st.notes)
    return build_profile(
        device=dev_info, environment=env, versions=versions, ceilings=ceilings, launch=launch, tables=out_tables,
        calibration={"quick": quick, "budget_s": budget_s, "elapsed_s": round(elapsed, 2),
                     "complete": skipped["budget"] == 0, "stopped": stopped,  # every entry had its first pass
                     "entries": len(jobs), "passes": passes, "skipped": skipped, "failed": failed, "notes": st.notes,
                     "caps": {"flops_per_call": st.flops_cap, "memory_bytes": st.memory_cap},
                     "timing": "CUDA graph replay, events" if cuda else "perf_counter, eager"},
        created=created)


PASSES_DIFFER = 0.2  # entries whose passes differ by more than this (relative to the lowest) are named in the notes


def _pass_spread(name: str, times: np.ndarray, axes: dict, notes: list, named: int = 3) -> dict:
    """The table's meta on its passes (`times`: per entry, per pass; NaN where a pass did not measure it): how
    many passes, how many measured every measured entry, and the largest relative spread of an entry between its
    passes (times per call, launch gaps included). The notes name the entries past PASSES_DIFFER (the worst
    `named` of them with their shape); the lowest time is kept."""
    passes = times.shape[-1]
    counts = np.sum(np.isfinite(times), axis=-1)
    measured = counts > 0
    out = {"passes": passes, "passes_completed": int(counts[measured].min()) if measured.any() else 0}
    twice = counts > 1
    if not twice.any():
        return out
    spread = np.where(twice, np.fmax.reduce(times, axis=-1) / np.fmin.reduce(times, axis=-1) - 1.0, np.nan)
    out["pass_spread_max"] = round(float(np.nanmax(spread)), 4)
    far = np.argwhere(spread > PASSES_DIFFER)
    if len(far):
        worst = sorted(far.tolist(), key=lambda i: -spread[tuple(i)])[:named]
        shapes = "; ".join(", ".join(f"{a}={axes[a][j]:g}" for a, j in zip(axes, i)) + f" (+{spread[tuple(i)]:.0%})"
                           for i in worst)
        notes.append(f"{name}: {len(far)} of its entries differed by more than {PASSES_DIFFER:.0%} between passes "
                     f"(the lowest time kept): {shapes}{'; ...' if len(far) > named else ''}")
    return out


def _ceilings(dev_info: dict, raw: dict, plan: dict, st: Settings) -> dict:
    """The datasheet peaks of a GPU with a preset; otherwise the best measured GEMM and copy rates."""
    from ..hardware import match_device_name

    preset = match_device_name(dev_info["name"]) if dev_info["kind"] == "cuda" else None
    if preset is not None:
        return {"flops_per_s": preset.peak_flops, "bytes_per_s": preset.bandwidth,
                "source": f"datasheet {preset.name}: {preset.peak_tflops:g} TFLOP/s, {preset.bandwidth_tbs:g} TB/s"}
    # the best rates ANY table reached (a CPU's fp32 GEMM can beat its bf16 one), so that no efficiency on these
    # ceilings exceeds 1 and every table stays inside what a profile may claim (profile.MAX_EFFICIENCY)
    best = {0: (0.0, ""), 1: (0.0, "")}
    for name, t in raw.items():
        if not np.isfinite(t).any():
            continue
        axes = plan[name]
        mesh = np.meshgrid(*[np.asarray(axes[a], dtype=float) for a in table_axes(name)], indexing="ij")
        work = entry_work(name, dict(zip(table_axes(name), mesh)), {"experts": st.experts})
        for kind_key in (0, 1):
            rate = float(np.max(np.asarray(work[kind_key], dtype=float) / np.where(np.isfinite(t), t, np.inf)))
            if rate > best[kind_key][0]:
                best[kind_key] = (rate, name)
    (fl, fl_from), (bw, bw_from) = best[0], best[1]
    return {"flops_per_s": fl or 1e12, "bytes_per_s": bw or 1e11,
            "source": f"best measured on {dev_info['name']} (no datasheet preset): {fl / 1e12:.3g} TFLOP/s "
                      f"({fl_from}), {bw / 1e9:.3g} GB/s read + written ({bw_from})"}


def _versions() -> dict:
    import platform

    import torch

    out = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "cuda": torch.version.cuda,
           "numpy": np.__version__,
           "python": platform.python_version(), "dsocr_core": "0.1.0"}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    return out


__all__ = ["LAUNCH_KEYS", "Settings", "grids", "launch_costs", "measure_entry", "run_microbench"]  # ops re-exported
