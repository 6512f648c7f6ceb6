"""How a GPU's speed moves under sustained load, and right after it.

The time model prices each kernel on a table measured by short replays. A long stage (SAM, CLIP or the LM prefill
of a large batch: 50-500 ms of back-to-back GEMMs) may run at lower clocks than those replays once the GPU reaches
its power cap, and a short stage right after it (the projector) may start on a GPU still slowed. Seen in this
project's traces: an H200 at its 700 W cap ran its SM clock at 1,620-1,860 MHz through half-second prefills
(1,980 MHz in the calibration), and an H100's projector graph took 15% longer right after 16 ms of GEMMs
(docs/accuracy.md). This benchmark measures both effects directly, with no model in the way:

* `sustained`: one kind of op (`gemm`: square bf16 GEMMs, compute-bound; `copy`: large device copies,
  bandwidth-bound) back to back for `--seconds`, after `--idle-s` of idling, with a CUDA event after every op.
  Each op's time is placed at its end time since the first op started; the ops are summarised in windows of that
  time (0-2 ms, 2-5 ms, ... 500-1,000 ms) as median op time, throughput and its ratio to the first window. The SM
  clock and power are read with nvidia-smi from a thread meanwhile (runtime/gpu_state.py; about one reading per
  20-50 ms) and summarised in the same windows.
* `after`: after idling, a burst of GEMMs lasting each of `--bursts-ms` (0: no burst), then `--probes` small
  copies (`--probe-mb`, about a projector's size) with an event after each; the burst lengths in turn for
  `--repeats` rounds. A probe slower after a burst than after none is what a stage right after a long compute
  stage pays.

    python benchmarks/sustained_load.py --out out/sustained.json                      # GPU: about 20 s
    python benchmarks/sustained_load.py --device cpu --quick --out /tmp/sl.json        # smoke test

The times are CUDA events on the GPU (host clocks on the CPU, where the ops run synchronously and no clock is read).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# op end times (ms since the first op started) are summarised in these windows
WINDOWS_MS = (0, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class SmiState:
    """The GPU's state ({sm_clock_mhz, power_w, throttle, ...}) as nvidia-smi reads it (runtime/gpu_state.py: power
    and the slowdown reasons as well as the clock; 20-50 ms a reading), for runtime/gpu_clocks.ClockSampler."""

    def __init__(self, device):
        self.device = device

    def read(self):
        from dsocr_core.runtime import gpu_state

        return gpu_state.read(self.device)


@contextmanager
def sampling(device):
    """The GPU's states read from a thread for the block's length (none on a CPU): yields the sampler."""
    from dsocr_core.runtime.gpu_clocks import ClockSampler

    sampler = ClockSampler(SmiState(device), period_s=0.005)
    if device.type == "cuda":
        sampler.run()
    try:
        yield sampler
    finally:
        if device.type == "cuda":
            sampler.stop()


class Timeline:
    """Op end times on one device: CUDA events recorded after each op, or host clocks on a CPU (ops synchronous)."""

    def __init__(self, device):
        import torch

        self.torch, self.cuda = torch, device.type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def ends_ms(self) -> list[float]:
        """Each op's end, ms after the first mark (taken just before the first op)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            return [self.marks[0].elapsed_time(e) for e in self.marks[1:]]
        return [(t - self.marks[0]) * 1e3 for t in self.marks[1:]]


def make_op(kind: str, size: int, device, dtype):
    """(op, work of one call, unit): `gemm` a [size, size] x [size, size] product (FLOPs), `copy` a copy of `size`
    MiB (bytes read and written)."""
    import torch

    if kind == "gemm":
        a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
        out = torch.empty(size, size, device=device, dtype=dtype)
        return (lambda: torch.mm(a, b, out=out)), 2.0 * size ** 3, "TFLOP/s"
    if kind == "copy":
        n = size * 2 ** 20 // torch.empty((), dtype=dtype).element_size()
        src, dst = torch.randn(n, device=device, dtype=dtype), torch.empty(n, device=device, dtype=dtype)
        return (lambda: dst.copy_(src)), 2.0 * n * src.element_size(), "TB/s"
    raise ValueError(f"unknown op kind {kind!r} (gemm, copy)")


def op_seconds(op, device, n: int = 5) -> float:
    """One op's time, measured briefly after one untimed call (to know how many make the run's length)."""
    from session_speed import wall  # this folder is on sys.path

    op()
    return wall(lambda: [op() for _ in range(n)], device) / n


def windows(ends_ms: list[float], durations_ms: list[float], work: float) -> list[dict]:
    """The ops grouped by end time into WINDOWS_MS: [{from_ms, to_ms, ops, median_op_ms, throughput (work/s)}]."""
    out = []
    for lo, hi in zip(WINDOWS_MS[:-1], WINDOWS_MS[1:]):
        ds = [d for e, d in zip(ends_ms, durations_ms) if lo <= e < hi]
        if ds:
            m = statistics.median(ds)
            out.append({"from_ms": lo, "to_ms": hi, "ops": len(ds), "median_op_ms": m, "throughput": work / (m / 1e3)})
    return out


def clocks_in_windows(samples, start_host: float, rows: list[dict]) -> None:
    """Adds each window's median SM clock and power (and the slowdowns seen) from the sampler's readings, placed by
    host time since the first op was queued (the queue was empty then, so the GPU started at once)."""
    from dsocr_core.runtime.gpu_state import slowdowns

    for row in rows:
        inside = [s for t, s in samples if row["from_ms"] <= (t - start_host) * 1e3 < row["to_ms"]]
        clocks = [s["sm_clock_mhz"] for s in inside if s.get("sm_clock_mhz") is not None]
        power = [s["power_w"] for s in inside if s.get("power_w") is not None]
        row["clock_samples"] = len(inside)
        row["sm_clock_mhz"] = statistics.median(clocks) if clocks else None
        row["power_w"] = statistics.median(power) if power else None
        row["slowdowns"] = sorted({r for s in inside for r in slowdowns(s)})


def exponent_of(slowdown: float, full_mhz: float | None, mhz: float | None, least_fall: float = 1.01) -> float | None:
    """x in slowdown = (full_mhz / mhz) ** x: how closely a time follows the clock; None where the clock fell by
    less than `least_fall` (or either clock is unknown), too little to tell."""
    if not full_mhz or not mhz or full_mhz / mhz <= least_fall:
        return None
    return math.log(slowdown) / math.log(full_mhz / mhz)


def clock_exponents(rows: list[dict], full_mhz: float | None) -> None:
    """Adds each window's `clock_exponent`: op time grows as (full clock / clock) ** exponent, against the fastest
    window of the first 20 ms (before any clock could fall), for windows from 50 ms on whose clock fell by more than
    2% (None elsewhere). For GEMMs it is the time model's analytic/predict.CLOCK_EXPONENT."""
    cool = [r["throughput"] for r in rows if r["to_ms"] <= 20]
    best = max(cool) if cool else rows[0]["throughput"]
    for row in rows:
        late = row["from_ms"] >= 50
        row["clock_exponent"] = exponent_of(best / row["throughput"], full_mhz, row.get("sm_clock_mhz"), 1.02) \
            if late else None


def torch_max_clock(device) -> float | None:
    """The GPU's maximum SM clock (MHz) as the environment records it (None on a CPU)."""
    if device.type != "cuda":
        return None
    from dsocr_core.measure.environment import capture_environment, full_sm_clock_mhz

    return full_sm_clock_mhz(capture_environment(str(device)))


def sustained(kind: str, size: int, seconds: float, idle_s: float, device, dtype) -> dict:
    """`kind` ops back to back for about `seconds` after `idle_s` of idling, summarised in windows."""
    op, work, unit = make_op(kind, size, device, dtype)
    count = max(int(seconds / op_seconds(op, device)), 3)
    time.sleep(idle_s)
    line = Timeline(device)
    with sampling(device) as sampler:
        time.sleep(0.05)  # an idle reading first
        start_host = time.perf_counter()
        line.mark()
        for _ in range(count):
            op()
            line.mark()
        ends = line.ends_ms()
        time.sleep(0.05)
    durations = [b - a for a, b in zip([0.0] + ends[:-1], ends)]
    rows = windows(ends, durations, work)
    clocks_in_windows(sampler.samples, start_host, rows)
    first = rows[0]["throughput"]
    for row in rows:
        row["vs_first"] = row["throughput"] / first
    clock_exponents(rows, torch_max_clock(device) or max((r["sm_clock_mhz"] or 0) for r in rows) or None)
    idle = [s for t, s in sampler.samples if t < start_host]
    return {"kind": kind, "size": size, "unit": unit, "ops": count, "span_ms": ends[-1], "windows": rows,
            "idle_state": idle[-1] if idle else None}


def probes_after(burst_ms: float, gemm, gemm_s: float, probe, probes: int, idle_s: float, device) -> list[float]:
    """Each probe's time (ms) right after a burst of GEMMs lasting about `burst_ms` (0: right after idling)."""
    time.sleep(idle_s)
    for _ in range(int(round(burst_ms / 1e3 / gemm_s))):
        gemm()
    line = Timeline(device)
    line.mark()
    for _ in range(probes):
        probe()
        line.mark()
    ends = line.ends_ms()
    return [b - a for a, b in zip([0.0] + ends[:-1], ends)]


def after(bursts_ms: list[float], size: int, probe_mb: int, probes: int, idle_s: float, repeats: int, device,
          dtype) -> dict:
    """The probes after each burst length (0: after idling only), the lengths in turn, `repeats` rounds: per burst
    length the median over rounds of each probe's time, then of those."""
    gemm, _, _ = make_op("gemm", size, device, dtype)
    probe, probe_bytes, _ = make_op("copy", probe_mb, device, dtype)
    gemm_s = op_seconds(gemm, device)
    op_seconds(probe, device)
    runs = {b: [] for b in bursts_ms}
    for _ in range(repeats):
        for burst in bursts_ms:
            runs[burst].append(probes_after(burst, gemm, gemm_s, probe, probes, idle_s, device))
    rows = []
    for burst, rounds in runs.items():
        times = [statistics.median(r[i] for r in rounds) for i in range(probes)]
        rows.append({"burst_ms": burst, "rounds_ms": rounds, "probe_ms": times, "first_probe_ms": times[0],
                     "median_first_5_ms": statistics.median(times[:5]), "median_probe_ms": statistics.median(times)})
    return {"probe_mb": probe_mb, "probe_bytes": probe_bytes, "gemm_size": size, "gemm_ms": gemm_s * 1e3,
            "repeats": repeats, "bursts": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small ops, short runs (CPU smoke test)")
    ap.add_argument("--kinds", default="gemm,copy", help="sustained op kinds: gemm, copy (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of each sustained run")
    ap.add_argument("--idle-s", type=float, default=3.0, help="idling before each run, so each starts cool")
    ap.add_argument("--gemm-size", type=int, default=8192, help="GEMM side (m = n = k)")
    ap.add_argument("--copy-mb", type=int, default=1024, help="MiB copied per copy op")
    ap.add_argument("--bursts-ms", default="0,5,20,100", help="burst lengths before the probes (0: none)")
    ap.add_argument("--probe-mb", type=int, default=16, help="MiB copied per probe")
    ap.add_argument("--probes", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the burst lengths (medians over rounds)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    from dsocr_core.measure.environment import capture_environment

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("CUDA is not available here: pass --device cpu (with --quick for a smoke test)")
    if args.seconds <= 0 or args.idle_s < 0 or args.probes < 1 or args.repeats < 1:
        ap.error("--seconds must be positive, --idle-s not negative, --probes and --repeats at least 1")
    try:
        bursts = [float(b) for b in args.bursts_ms.split(",") if b]
        kinds = [k for k in args.kinds.split(",") if k]
    except ValueError as exc:
        ap.error(f"--bursts-ms: {exc}")
    if not kinds or any(k not in ("gemm", "copy") for k in kinds):
        ap.error(f"--kinds: a comma list of gemm and copy, not {args.kinds!r}")
    if args.seconds > WINDOWS_MS[-1] / 1e3 - 1:
        ap.error(f"--seconds: at most {WINDOWS_MS[-1] / 1e3 - 1:.0f} (the last window ends at {WINDOWS_MS[-1]} ms)")
    if args.quick:
        args.gemm_size, args.copy_mb, args.probe_mb = 64, 1, 1
        args.seconds, args.idle_s, args.probes, args.repeats = min(args.seconds, 0.05), 0.0, min(args.probes, 5), 1
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {"benchmark": "sustained_load", "environment": capture_environment(args.device),
              "dtype": str(dtype).replace("torch.", ""), "settings": {k: v for k, v in vars(args).items()
                                                                       if k != "out"}, "sustained": [], "after": None}
    result["settings"]["out"] = str(args.out)

    def save():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))

    for kind in kinds:
        size = args.gemm_size if kind == "gemm" else args.copy_mb
        run = sustained(kind, size, args.seconds, args.idle_s, device, dtype)
        result["sustained"].append(run)
        save()
        print(f"== sustained {kind} (size {size}): {run['ops']} ops over {run['span_ms']:.0f} ms")
        print(f"   {'window ms':>13} {'ops':>5} {'op ms':>9} {run['unit']:>9} {'vs first':>8} {'SM MHz':>7} {'W':>5}"
              f" {'exponent':>8}")
        for w in run["windows"]:
            scale = 1e12
            clock = f"{w['sm_clock_mhz']:7.0f}" if w.get("sm_clock_mhz") is not None else "      -"
            power = f"{w['power_w']:5.0f}" if w.get("power_w") is not None else "    -"
            exponent = f"{w['clock_exponent']:8.2f}" if w.get("clock_exponent") is not None else "       -"
            print(f"   {w['from_ms']:>5}-{w['to_ms']:<7} {w['ops']:>5} {w['median_op_ms']:9.3f} "
                  f"{w['throughput'] / scale:9.2f} {w['vs_first']:8.3f} {clock} {power} {exponent}"
                  + (f"  {', '.join(w['slowdowns'])}" if w.get("slowdowns") else ""))
    if bursts:
        result["after"] = after(bursts, args.gemm_size, args.probe_mb, args.probes, args.idle_s, args.repeats, device,
                                dtype)
        save()
        a = result["after"]
        print(f"== {a['probe_mb']} MiB copies after bursts of {a['gemm_size']}^3 GEMMs ({a['gemm_ms']:.2f} ms each)")
        base = a["bursts"][0]["median_probe_ms"]
        for row in a["bursts"]:
            print(f"   burst {row['burst_ms']:6.0f} ms: first probe {row['first_probe_ms'] * 1e3:8.1f} us, first 5 "
                  f"{row['median_first_5_ms'] * 1e3:8.1f} us, all {row['median_probe_ms'] * 1e3:8.1f} us "
                  f"({(row['median_probe_ms'] / base - 1) * 100:+.1f}% against the first row)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
