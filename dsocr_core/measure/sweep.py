"""Measured sweeps: time every stage of the session over a grid of workloads and store each point at once.

Per point: the engine's kept state released (each point starts where a fresh process measuring only that point
starts: the same cache room, graphs captured anew; compiled functions are kept, they compile per shape), synthetic
inputs of the target shape, `warmup` untimed runs, `repeats` timed runs (prefill stages and K decode steps),
medians and spread, the SM clock each stage ran at (runtime/gpu_clocks.py), the engine's state (how the point was
run: compiled variants, graphs, buckets, cache room), then FLOPs in a separate counting pass. After the last point
the first one is measured again (`order_check`) and the run flagged when the two disagree beyond their spread (see
order_check.py). A point is written to the store as soon as it is measured, so an interrupt loses nothing already
measured and a re-run resumes by skipping finished points. An out-of-memory is caught, memory freed, the point
recorded as `oom`, and the sweep goes on.
"""
from __future__ import annotations

import gc
import itertools
import re
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from ..results.store import RunStore, point_key
from ..runtime import gpu_state
from ..runtime.gpu_clocks import StageClocks
from ..runtime.host_speed import probe_host_op_s, probe_median
from ..runtime.inputs import synthetic_for_workload
from ..runtime.oom import free_memory, out_of_memory
from ..runtime.session import Session
from ..spec import Workload
from ..tiling import HF_CROP_RANGE, candidate_grids, mode_info, sequence_length
from . import order_check as checks
from .stage_stats import assemble_stages, counted_flops, timed_generation

Progress = Callable[[int, int, Workload, str], None]  # (points handled, total, workload, status)


def vendor_grids(min_crops: int = HF_CROP_RANGE[0], max_crops: int = HF_CROP_RANGE[1]) -> list[tuple[int, int]]:
    """Every tile grid the vendor's rule can choose in a crop range (DeepSeek-OCR HF: 2..9 tiles, 1x2, 2x1, ...,
    3x3, 1x9, 9x1; DeepSeek-OCR 2: 2..6)."""
    return candidate_grids(min_crops, max_crops)


def sweep_workloads(modes: Iterable[str] = ("gundam",), grids: Iterable[tuple[int, int]] = ((1, 1),),
                    text_tokens: Iterable[int] = (10,), batches: Iterable[int] = (1,),
                    decode_steps: Iterable[int] = (32,), dtype: str = "bfloat16", attn: str = "sdpa",
                    logits: str = "all") -> list[Workload]:
    """The grid as Workloads. Crop grids apply to the tiling modes; other modes get one point per setting."""
    out, seen = [], set()
    for mode, grid, text, batch, steps in itertools.product(modes, grids, text_tokens, batches, decode_steps):
        crops = tuple(grid) if mode_info(mode).crop_mode else None
        w = Workload(mode=mode, crops=crops, text_tokens=text, batch=batch, decode_steps=steps, dtype=dtype,
                     attn=attn, logits=logits)
        if point_key(w) not in seen:
            seen.add(point_key(w))
            out.append(w)
    return out


@dataclass
class PointResult:
    stages: dict[str, dict]
    kv_bytes: int
    resolved: dict
    engine_state: dict
    host_probe_op_s: float | None = None  # the host's speed while the point ran (runtime/host_speed.py)
    gpu_state: dict | None = None  # {before, after}: the GPU's clocks around the timed repeats (runtime/gpu_state.py)
    # {stage: {mhz, samples}}: the SM clock while each stage ran, over the timed repeats (runtime/gpu_clocks.py);
    # None where NVML cannot be read (a CPU)
    stage_clocks: dict | None = None


def workload_label(w: Workload) -> str:
    """A point in a few words (progress bars, messages): mode, crop grid, text tokens, batch, decode steps."""
    crops = f" {w.crops[0]}x{w.crops[1]}" if w.crops else ""
    return f"{w.mode}{crops} T{w.text_tokens} B{w.batch} K{w.decode_steps}"


def failure(exc: BaseException, workload: Workload | None = None, vocab_size: int | None = None) -> tuple[str, str]:
    """(status, one-line message) of a point that raised: 'oom' for out-of-memory (with its reason where it is the
    all-position logits of `workload`), else 'error' with where."""
    status = "oom" if out_of_memory(exc) else "error"
    message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    if status == "oom" and workload is not None and vocab_size is not None:
        message = oom_hint(message, workload, vocab_size)
    frames = traceback.extract_tb(exc.__traceback__)
    if status == "error" and frames:
        where = frames[-1]
        message += f" | at {where.filename.rsplit('/', 1)[-1]}:{where.lineno} in {where.name}"
    return status, message


_ASKED = re.compile(r"Tried to allocate ([0-9.]+) (GiB|MiB)")


def oom_hint(message: str, workload: Workload, vocab_size: int) -> str:
    """`message` of an out-of-memory point, with the reason named where it is the all-position logits: a row of the
    vocabulary at every prompt position of every page (what logits="all", the vendor's HF default, asks for;
    the lm_head writes it in the model's 16-bit dtype, then `.float()` copies it to float32, and either allocation
    can be the one that fails) outgrows a GPU long before the model does; logits="last" needs one row per page."""
    asked = _ASKED.search(message)
    if workload.logits != "all" or asked is None:
        return message
    cells = workload.batch * sequence_length(workload) * vocab_size
    asked_bytes = float(asked.group(1)) * 2**30 / (1 if asked.group(2) == "GiB" else 1024)
    if not any(abs(asked_bytes - cells * size) <= 0.02 * cells * size for size in (2, 4)):
        return message
    return (f"the all-position float32 logits alone are {cells * 4 / 2**30:.1f} GiB ({workload.batch} x "
            f"{sequence_length(workload):,} prompt tokens x {vocab_size:,} x 4 bytes): measure with last-position "
            f"logits (--logits last) | {message}")


@contextmanager
def collector_paused():
    """Python's garbage collector off while a point is timed, as timeit does: a host-bound (eager) run would
    otherwise be charged whichever full collection falls into it, and when one falls depends on what the
    process allocated before (a long sweep or a fresh process). The garbage is collected before and after."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


@contextmanager
def older_objects_frozen():
    """The garbage collected, then the objects alive (the model's modules, torch's and transformers' own: hundreds
    of thousands) kept out of the collector's scans until the block ends (gc.freeze), so a collection inside it
    scans only what the block allocated: collector_paused's two collections and free_memory's cost milliseconds
    instead of a scan of the whole process (0.1 s and more each, per point, on a long sweep). After the block the
    objects go back to the oldest generation, for the collector's next full run. Inside another such block it
    does nothing (the outer block's objects stay frozen). Freezing and the collector's switch are process-wide:
    callers hold the session's lock, so no other thread measures meanwhile (the dashboard's job threads do)."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure_point(session: Session, workload: Workload, repeats: int = 3, warmup: int = 1,
                  seed: int = 0, count_flops: bool = True) -> PointResult:
    """Time one workload (medians over `repeats` after `warmup`), then count its FLOPs in a separate pass.
    Each run is the greedy generator through the session's engine: the prefill, the first token and
    `decode_steps` decode steps, whatever tokens come (no stop at EOS, no n-gram ban: the cost of the shape)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    session.engine.release()  # start from the state a fresh process has (see the module docstring)
    with older_objects_frozen():
        free_memory(session.device)
        inputs = synthetic_for_workload(workload, seed=seed).to(session.device, session.torch_dtype)
        run = dict(no_repeat_ngram_size=0, logits=workload.logits, stop_at_eos=False, memory="none")
        for _ in range(warmup):  # compiles and graph captures leave garbage: collected before the timed runs
            timed_generation(session, inputs, min(workload.decode_steps, 2) + 1, **run)
        with collector_paused():
            runs, probes = [], []
            gpu_before = gpu_state.read(session.device)  # the clocks it starts at (None on a CPU)
            with StageClocks(session.device) as clocks:  # the SM clock of each stage through the repeats
                for _ in range(repeats):  # the host's speed probed beside every timed run: it drifts over seconds
                    with clocks.paused():
                        probes.append(probe_host_op_s(session.device))
                    runs.append(timed_generation(session, inputs, workload.decode_steps + 1, timer=clocks.timer(),
                                                 **run))
            probes.append(probe_host_op_s(session.device))
            gpu_after = gpu_state.read(session.device)
        engine_state = session.engine.point_state(inputs.batch)
        # the timed engine's cache, buffers and graphs go before the counting pass over the reference model, which
        # then has the whole GPU (the next point starts from a released engine anyway)
        session.engine.release()
        flops = counted_flops(session, inputs, workload.logits) if count_flops else None
    stages = assemble_stages(runs, flops, decode_step_over="repeats")
    resolved = {"image_slots": inputs.image_slots, "sequence": inputs.seq_len, "batch": inputs.batch,
                "text_tokens": inputs.text_tokens}
    if workload.crops is None and workload.image_size is not None:  # the grid the page size chose
        resolved["grid"] = tuple(int(x) for x in inputs.images_spatial_crop[0].tolist())
    return PointResult(stages, runs[-1].kv_bytes, resolved, engine_state, probe_median(probes),
                       gpu_state.span(gpu_before, gpu_after), clocks.result())


def point_extra(result: PointResult) -> dict:
    """What a stored point keeps beside its stage times: the engine's state, the host's speed, the GPU's
    state just before and after its timed repeats and the SM clock each stage ran at."""
    extra = {"engine_state": result.engine_state}
    if result.host_probe_op_s is not None:
        extra["host_probe_op_s"] = result.host_probe_op_s
    if result.gpu_state is not None:
        extra["gpu_state"] = result.gpu_state
    if result.stage_clocks:
        extra["stage_clocks"] = result.stage_clocks
    return extra


def measure_with_attn(session: Session, workload: Workload, *args, **kwargs) -> PointResult:
    """measure_point with the workload's attention implementation, the session's own restored afterwards."""
    try:
        if workload.attn != session.attn_impl:
            session.model.set_attn_impl(workload.attn)
        return measure_point(session, workload, *args, **kwargs)
    finally:
        session.model.set_attn_impl(session.attn_impl)


def run_sweep(session: Session, store: RunStore, workloads: list[Workload], run_id: str | None = None,
              name: str = "measured sweep", repeats: int = 3, warmup: int = 1, seed: int = 0,
              progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
              meta: dict | None = None, kind: str = "sweep", order_check: bool = True) -> str:
    """Measure every workload not yet finished in `run_id` (a new run when None). Returns the run id.

    `should_stop` is polled between points (the app's stop button, a time limit) and once more before the order
    check; an interrupt leaves every finished point in the store. `order_check`: once every point is measured, the
    run's first point is measured again and the comparison stored in the run's meta["order_check"] (see
    recheck_first; progress reports status "recheck"); a stopped run has none.
    A caller measuring point by point (the dashboard) passes order_check=False and calls recheck_first at the end."""
    from .environment import capture_environment

    if run_id is None:
        run_id = store.create_run(kind, name, capture_environment(str(session.device)), session.weights,
                                  dtype=session.dtype, attn=session.attn_impl, session_mode=session.session_mode,
                                  meta={**(meta or {}), "repeats": repeats, "warmup": warmup, "seed": seed,
                                        "session": session.describe(),
                                        "spec": session.spec.model_dump(mode="json")})
    done = store.finished_keys(run_id)
    total = len(workloads)
    stopped = False
    session.engine.release()  # what an earlier run kept goes now, not frozen with the rest
    with older_objects_frozen():  # every point's collections then scan only what the sweep allocated
        for i, workload in enumerate(workloads, 1):
            if should_stop is not None and should_stop():
                stopped = True
                break
            if point_key(workload) in done:
                if progress:
                    progress(i, total, workload, "skipped")
                continue
            status, message = "done", ""
            try:
                result = measure_with_attn(session, workload, repeats, warmup, seed)
                store.put_point(run_id, workload, "done", "", result.stages, result.kv_bytes, result.resolved,
                                point_extra(result))
            except Exception as exc:  # one bad point must not end the sweep
                status, message = failure(exc, workload, session.spec.vocab_size)
            if status != "done":
                # outside the except block: the traceback (and the failed point's tensors) is gone by now
                free_memory(session.device)
                store.put_point(run_id, workload, status, message)
            if progress:
                progress(i, total, workload, status)
        stopped = stopped or (should_stop is not None and should_stop())  # e.g. no time left for the repeat
        if order_check and not stopped:
            announce = (lambda w: progress(total, total, w, "recheck")) if progress else None
            recheck_first(session, store, run_id, repeats, warmup, seed, announce)
    return run_id


def recheck_first(session: Session, store: RunStore, run_id: str, repeats: int = 3, warmup: int = 1,
                  seed: int = 0, announce: Callable[[Workload], None] | None = None) -> dict | None:
    """The order check (order_check.py): the run's first point measured again, now that the others ran,
    compared with what is stored and recorded in the run's meta. None (nothing stored) when the run has fewer
    than two finished points. `announce(workload)` is called before the point is measured again."""
    first = checks.first_point(store, run_id)
    if first is None:
        return None
    key, stored, first_extra = first
    workload = Workload(**key)
    if announce:
        announce(workload)
    try:
        again = measure_with_attn(session, workload, repeats, warmup, seed, count_flops=False)
    except Exception as exc:  # noqa: BLE001 - the run's points are stored; say why the check is missing
        free_memory(session.device)
        return checks.record(store, run_id, {"workload": key, "skipped": failure(exc)[1]})
    check = checks.compare(stored, again.stages, key)
    check["engine_state_again"] = again.engine_state
    check["host_probe_op_s_again"] = again.host_probe_op_s  # a host in a slower spell shows here
    return checks.record(store, run_id, checks.with_gpu_states(check, first_extra, again.gpu_state))
