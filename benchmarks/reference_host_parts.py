"""Where the reference engine's host time goes, stage by stage and in the projector's two timed parts.

Per point (the full-size model, synthetic weights, one page size and batch, one decode step):

* each stage timed as the sweeps time it (runtime/timing.StageTimer: CUDA events, a synchronisation and a short GPU
  wait before each stage) and on the host clock (the device synchronised first, perf_counter around the stage: the
  host's time to issue it), beside the kernel-launching ops, views and Python-level torch calls the op counter sees
  (runtime/op_count.py) and the host probe (runtime/host_speed.py);
* the projector stage's two timed parts (the projector GEMM over each view group; the per-image slot layout), each
  part's event time and the host's time inside it, with the stage timer's wait before the part and with a wait of
  one cycle instead ("without the wait"; the synchronisation before it stays);
* the host time of the first ops after a synchronisation against the same ops in a steady stream;
* the host time of one image's slot layout and of its calls, one at a time (micro-timed, 400 calls each);
* one more run with the projector's parts under the CPU profiler: each op's host time (self and total).

What it showed on an H200 (docs/accuracy.md, "The reference expert loop one expert at a time, and the projector's
views"): the layout's views were a third of its host time and not priced; the projector GEMM's part takes the host
0.1-0.3 ms for two launching ops.

    python benchmarks/reference_host_parts.py --points "base,1x1,20,1;base,1x1,20,9;gundam,3x2,20,2" --out parts.json
    python benchmarks/reference_host_parts.py --device cpu --preset tiny --points "tiny,1x1,8,2" --repeats 1 \\
        --out /tmp/parts.json                                                                    # a smoke test
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.analytic.points import Points  # noqa: E402
from dsocr_core.calibration.host_stages import _HostTimer  # noqa: E402
from dsocr_core.measure.environment import capture_environment  # noqa: E402
from dsocr_core.model import synthetic_model  # noqa: E402
from dsocr_core.registry import FAMILIES  # noqa: E402
from dsocr_core.runtime import timing  # noqa: E402
from dsocr_core.runtime.engine import ReferenceEngine  # noqa: E402
from dsocr_core.runtime.host_speed import probe_host_op_s  # noqa: E402
from dsocr_core.runtime.inputs import synthetic_inputs  # noqa: E402
from dsocr_core.runtime.op_count import (LAUNCH, METADATA, count_reference_run, run_reference,  # noqa: E402
                                         workload_rows)
from dsocr_core.runtime.timing import StageTimer  # noqa: E402

STAGES = FAMILIES["deepseek-ocr"].stage_names
WARMUP = 2


class PartTimer(StageTimer):
    """The sweeps' stage timer, also recording the host's time inside each entry (from its start event's record to
    its end event's), with or without the timer's wait before a stage (`cover`)."""

    def __init__(self, device: torch.device, cover: bool = True, profile: str | None = None):
        super().__init__(device)
        self.cover, self.host = cover, []
        self.profile, self.ops = profile, []  # stage whose entries run under the CPU profiler; their ops' host time

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        saved = timing.LAUNCH_COVER_CYCLES
        if not self.cover:
            timing.LAUNCH_COVER_CYCLES = 1
        try:
            with super().stage(name, track_memory, count) as mark:
                if name == self.profile:
                    from torch.profiler import ProfilerActivity, profile

                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        yield mark
                    self.ops.append({e.key: (e.count, e.self_cpu_time_total * 1e-6, e.cpu_time_total * 1e-6)
                                     for e in prof.key_averages()})
                else:
                    t0 = time.perf_counter()
                    yield mark
                    self.host.append((name, time.perf_counter() - t0))
        finally:
            timing.LAUNCH_COVER_CYCLES = saved


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def after_sync(device: torch.device, rounds: int = 60) -> dict:
    """Seconds of host time per op of 8 small eager ops (4 cats, 4 adds): in a steady stream, right after a
    synchronisation, and right after a synchronisation that waited for a busy GPU."""
    a = torch.randn(256, 1280, device=device, dtype=torch.bfloat16)
    b = torch.randn(1, 1280, device=device, dtype=torch.bfloat16)

    def ops():
        for _ in range(4):
            torch.cat([a, b])
            a + a

    out = {}
    for label, wait in (("steady", None), ("after_sync", 0), ("after_busy_sync", 2_000_000)):
        times = []
        for _ in range(rounds):
            if wait is None:
                ops()
            else:
                if wait and device.type == "cuda":
                    torch.cuda._sleep(wait)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            ops()
            times.append((time.perf_counter() - t0) / 8)
        out[label] = statistics.median(times[10:])
    return out


def layout_calls(model, device: torch.device, calls: int = 400) -> dict:
    """Host seconds per call, in a warm loop, of the projector's two calls (batch 1) and of one untiled image's slot
    layout and the calls it makes (DeepSeek-OCR's)."""
    vm = model.model
    h = model.spec.hidden_size
    g = 16
    glob = torch.randn(2, g * g, h, device=device, dtype=model.lm_head.weight.dtype)
    grid = glob[0].reshape(g, g, h)
    rows = torch.randn(g * (g + 1), h, device=device, dtype=glob.dtype)
    clip = torch.randn(1, 1 + g * g, model.spec.clip_width, device=device, dtype=glob.dtype)
    sam = torch.randn(1, model.spec.projector_input_dim - model.spec.clip_width, g, g, device=device, dtype=glob.dtype)
    features = vm.projector_input(clip, sam)
    cases = {
        "the projector's cat (CLIP's features, SAM's map transposed)": lambda: vm.projector_input(clip, sam),
        "the projector's Linear (its bias, a 3-D input)": lambda: vm.projector(features),
        "select": lambda: glob[0],
        "reshape (a view)": lambda: glob[0].reshape(g, g, h),
        ".to (no-op)": lambda: vm.image_newline.to(glob.dtype),
        "expand": lambda: vm.image_newline.expand(g, 1, h),
        "unsqueeze": lambda: vm.view_seperator[None],
        "cat of the rows and the newline column": lambda: torch.cat([grid, vm.image_newline.expand(g, 1, h)], dim=1),
        "cat of the rows and view_seperator": lambda: torch.cat([rows, vm.view_seperator[None]]),
        "add (for scale)": lambda: rows + rows,
        "one image's layout (layout_image, 1x1)": lambda: vm.layout_image(glob[0], None, (1, 1)),
    }
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    out = {}
    with torch.no_grad():
        for name, fn in cases.items():
            fn()
            sync()
            rounds = []
            for _ in range(6):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                rounds.append((time.perf_counter() - t0) / calls)
                sync()
            out[name] = statistics.median(rounds[1:])
    return out


def measure_point(engine, model, mode: str, grid: tuple[int, int], text: int, batch: int, repeats: int,
                  device: torch.device) -> dict:
    inputs = synthetic_inputs(mode, grid, text, batch, dtype=model.lm_head.weight.dtype, device=device)
    cuda = device.type == "cuda"
    with torch.no_grad():
        for _ in range(WARMUP):
            run_reference(engine, inputs, StageTimer(device), 1)
        probes, events, hosts, parts = [], [], [], {True: [], False: []}
        for _ in range(repeats):
            probes.append(probe_host_op_s(device))
            timer = StageTimer(device)
            run_reference(engine, inputs, timer, 1)
            events.append(timer.totals())
            host = _HostTimer(str(device))
            run_reference(engine, inputs, host, 1)
            if cuda:
                torch.cuda.synchronize(device)
            hosts.append(dict(host.times))
            for cover in (True, False):
                pt = PartTimer(device, cover)
                run_reference(engine, inputs, pt, 1)
                parts[cover].append(([s for n, s in pt.finish() if n == "projector"],
                                     [s for n, s in pt.host if n == "projector"]))
        profiled = PartTimer(device, profile="projector")  # where a part's host time goes, op by op
        run_reference(engine, inputs, profiled, 1)
        pts = Points.build(mode=mode, crops=grid if grid != (1, 1) else None, text_tokens=text, batch=batch,
                           decode_steps=1, dtype=str(model.lm_head.weight.dtype).removeprefix("torch."),
                           attn=model.attn_impl, logits="last")
        paths = {r.kind: tuple(r.paths) for rows in workload_rows(model.spec, pts, 1).values() for r in rows}
        tally = count_reference_run(engine, inputs, paths, decode_steps=1)
    n_parts = len(parts[True][0][0])
    return {
        "workload": dict(mode=mode, grid=list(grid), text_tokens=text, batch=batch),
        "host_probe_op_s": _median(probes),
        "event_s": {s: _median(e.get(s) for e in events) for s in STAGES},
        "host_s": {s: _median(h.get(s) for h in hosts) for s in STAGES},
        "ops": {s: dict(launch=tally.stage_count(s, LAUNCH), metadata=tally.stage_count(s, METADATA),
                        python_calls=sum(sum(c.values()) for (st, _), c in tally.calls.items() if st == s))
                for s in STAGES},
        "projector_parts": {("with the wait" if cover else "without the wait"): {
            "event_s": [_median(r[0][i] for r in runs) for i in range(n_parts)],
            "host_s": [_median(r[1][i] for r in runs) for i in range(n_parts)]} for cover, runs in parts.items()},
        # per part, each op's (calls, self host seconds, total host seconds) under the CPU profiler (its overhead
        # included: for where the time goes, not how much)
        "projector_part_ops": profiled.ops,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="base,1x1,20,1;base,1x1,20,9;base,1x1,20,27;gundam,3x2,20,2",
                    help="mode,WxH,text tokens,batch; separated by ';'")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke test")
    ap.add_argument("--preset", default="full", choices=("full", "tiny"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("reference_host_parts: no CUDA GPU here (--device cpu runs a smoke test)")
    device = torch.device(args.device)
    spec = FAMILIES["deepseek-ocr"].preset(args.preset)
    model = synthetic_model(spec, seed=0, dtype="bfloat16", device=device, attn_impl="sdpa")
    engine = ReferenceEngine(model)
    out = {"environment": capture_environment(device), "preset": args.preset, "repeats": args.repeats,
           "after_sync_op_s": after_sync(device), "layout_call_s": layout_calls(model, device), "points": []}
    print("host s per op:", {k: f"{v * 1e6:.2f} us" for k, v in out["after_sync_op_s"].items()}, flush=True)
    for spec_text in args.points.split(";"):
        mode, grid, text, batch = spec_text.split(",")
        rec = measure_point(engine, model, mode, tuple(int(v) for v in grid.split("x")), int(text), int(batch),
                            args.repeats, device)
        out["points"].append(rec)
        ms = lambda v: None if v is None else round(v * 1e3, 3)  # noqa: E731
        parts = rec["projector_parts"]["with the wait"]
        probe = "-" if rec["host_probe_op_s"] is None else f"{rec['host_probe_op_s'] * 1e6:.1f} us"
        print(f"{spec_text}: probe {probe}; "
              f"events ms {({s: ms(v) for s, v in rec['event_s'].items()})}; host ms "
              f"{({s: ms(v) for s, v in rec['host_s'].items()})}; projector parts events "
              f"{[ms(v) for v in parts['event_s']]} host {[ms(v) for v in parts['host_s']]}", flush=True)
        for i, ops in enumerate(rec["projector_part_ops"]):
            top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:6]
            print(f"  projector part {i + 1}, most host time (self, under the profiler): "
                  + ", ".join(f"{k} x{n} {t * 1e6:.0f} us" for k, (n, t, _) in top), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({"points": len(out["points"]), "out": args.out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
