"""The host cost of the reference model's own eager ops, per stage (the profile's launch.host_op_s_by_stage).

The op mixes of calibration/ops.py time one Python call of one op on tiny tensors. The model's code is other code:
a Python call may dispatch several counted ops, module calls add hooks, SDPA chooses a backend for each shape, the
expert loop reads counts back, and each stage has its own mix. On the H100s the reference mode was measured on, a
launching op of the LM prefill cost the host about 13 us, a decode step's 17 and CLIP's 20-32, while the op mixes
measured 15-30 us for every kind depending on the machine (docs/accuracy.md, "Host cost per op, measured on the
model"). The eager reference path is host-bound at small batches, so that is most of its prediction error.

So the cost is measured on the model itself: the reference engine runs the full-size model (synthetic weights) on
one small page at batch 1 and a few greedy decode steps. Per stage, the host time to issue it (perf_counter around
the stage, the device synchronised before it starts so no sync inside waits for earlier work) divided by the
kernel-launching ops the same engine dispatches for that stage (runtime/op_count.py, the counter the reference plan
is held to) is the cost of one op of that stage, its views and Python between ops included. A narrow model of the
same structure was tried first and did not carry to the full widths (its LM ops cost the host less), so the
calibration builds the real size.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

from ..registry import HOST_COST_STAGES

# a 1024 px view and two 640 px tiles (both SAM view sizes), a short prompt, a few decode steps
MODE, GRID, TEXT_TOKENS, DECODE_STEPS = "gundam", (2, 1), 64, 4


class _HostTimer:
    """The engine's stage timer on the host clock: the device synchronised first, then perf_counter around the
    stage, nothing synchronised inside, so a stage's time is the host's time to issue it."""

    def __init__(self, device: str):
        self.device = device
        self.times: dict[str, float] = {}
        self.current = None

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
        outer, self.current = self.current, name
        t0 = time.perf_counter()
        try:
            yield None
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
            self.current = outer


def host_costs_by_stage(device: str, spec=None, repeats: int = 5, mode: str = MODE,
                        grid: tuple[int, int] = GRID, probes: list | None = None) -> dict[str, float]:
    """Seconds of host time per kernel-launching op of each stage (registry.HOST_COST_STAGES) of the reference engine
    running `spec` (default: DeepSeek-OCR at full size) with synthetic weights on `device`, one page of `mode` and
    `grid` at batch 1. On a CPU the ops run synchronously, so the times hold the work too (tests only). `probes`:
    a list the host's speed before each timed run is appended to (runtime/host_speed.py; CUDA only)."""
    from ..runtime.host_speed import probe_host_op_s

    import torch

    from ..analytic.points import Points
    from ..model import synthetic_model
    from ..runtime.engine import ReferenceEngine
    from ..runtime.inputs import synthetic_inputs
    from ..runtime.op_count import LAUNCH, count_reference_run, run_reference, workload_rows
    from ..spec import ModelSpec

    model = synthetic_model(spec or ModelSpec(), seed=0, dtype="bfloat16", device=device, attn_impl="sdpa")
    try:
        engine = ReferenceEngine(model)
        inputs = synthetic_inputs(mode, grid, TEXT_TOKENS, 1, dtype=torch.bfloat16, device=device)
        pts = Points.build(mode=mode, crops=grid, text_tokens=TEXT_TOKENS, batch=1, decode_steps=1,
                           dtype="bfloat16", attn="sdpa", logits="last")
        paths = {r.kind: tuple(r.paths) for rows in workload_rows(model.spec, pts, 1).values() for r in rows}
        with torch.no_grad():
            tally = count_reference_run(engine, inputs, paths, decode_steps=DECODE_STEPS)
            ops = {s: tally.stage_count(s, LAUNCH) for s in HOST_COST_STAGES}
            runs = []
            for i in range(repeats + 2):  # two warm-up runs: first calls load kernels and fill the allocator
                if i >= 2 and probes is not None and device.startswith("cuda"):
                    probes.append(probe_host_op_s(device))
                timer = _HostTimer(device)
                run_reference(engine, inputs, timer, DECODE_STEPS)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(device)
                if i >= 2:
                    runs.append(timer.times)
    finally:
        engine = model = None  # the weights' last references, so the cache can hand their memory back
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return {s: statistics.median(r[s] for r in runs) / ops[s] for s in HOST_COST_STAGES if ops[s] and s in runs[0]}
