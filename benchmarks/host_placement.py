"""Where the host of an eager (host-bound) run is slow: per-op host cost of a fresh process on each CPU core.

The reference session mode spends most of its time issuing small CUDA ops from Python, so its measured stage
times follow the host's speed. Fresh processes of the same point have differed by up to 80% on the shared GPU
machines (docs/results/h100_order_independence_reference_noise). This benchmark asks whether that is placement
(some cores slower, e.g. far from the GPU or shared with another tenant) or the machine as a whole: a fresh process
pinned to each core in turn, and a few unpinned ones, each timing

  - launch: a tiny CUDA op issued in a loop (host issue time per op, perf_counter around the loop, no sync inside),
  - eager:  a small eager block of the reference mode's op kinds (linear, SiLU, multiply, index, index_put),
  - python: a pure-Python loop (the CPU's own speed, no CUDA),

as medians over repeats, with the process's CPU time beside the wall time (wall above CPU: the process was not
running, e.g. descheduled) and the machine's steal time from /proc/stat over the run.

    python benchmarks/host_placement.py --out out/host_placement        # about 1-2 minutes on a 16-core machine
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def steal_ticks() -> int:
    """The machine's steal time so far (clock ticks, /proc/stat's 8th field; 0 where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) if len(fields) > 8 else 0
    except OSError:
        return 0


def child(core: int | None, repeats: int) -> dict:
    """One fresh process: pinned to `core` (None: wherever the OS puts it), times the three loops."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import torch

    dev = torch.device("cuda")
    x = torch.zeros(16, device=dev)
    a = torch.randn(8, 1280, device=dev, dtype=torch.bfloat16)
    w = torch.randn(896, 1280, device=dev, dtype=torch.bfloat16)
    idx = torch.arange(8, device=dev)
    out = torch.empty(8, 896, device=dev, dtype=torch.bfloat16)

    def launch(n=2000):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            x.add_(1.0)
        t1, c1 = time.perf_counter(), time.process_time()
        torch.cuda.synchronize()
        return (t1 - t0) / n, (c1 - c0) / n

    def eager(n=300):  # five ops per pass, as an expert of the reference MoE issues them
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            h = torch.nn.functional.linear(a[idx], w)
            out[idx] = torch.nn.functional.silu(h) * h
        t1, c1 = time.perf_counter(), time.process_time()
        torch.cuda.synchronize()
        return (t1 - t0) / (5 * n), (c1 - c0) / (5 * n)

    def python(n=300_000):
        t0 = time.perf_counter()
        s = 0
        for i in range(n):
            s += i
        return (time.perf_counter() - t0) / n, 0.0

    for f in (launch, eager, python):  # warm-up: the first calls load kernels and fill caches
        f()
    res = {"core": core, "ran_on": sorted(os.sched_getaffinity(0)) if core is None else [core]}
    steal0 = steal_ticks()
    for name, f in (("launch", launch), ("eager", eager), ("python", python)):
        wall, cpu = zip(*(f() for _ in range(repeats)))
        res[f"{name}_us"] = statistics.median(wall) * 1e6
        res[f"{name}_cpu_us"] = statistics.median(cpu) * 1e6
        res[f"{name}_spread"] = (max(wall) - min(wall)) / statistics.median(wall)
    res["steal_ticks"] = steal_ticks() - steal0
    return res


def run_child(core: int | None, repeats: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", "none" if core is None else str(core), "--repeats", str(repeats)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        return {"core": core, "error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def machine_facts() -> dict:
    """What decides placement: the cores this process may use, the GPU's local cores (sysfs), the NUMA layout,
    the CPU model and frequency governor."""
    facts: dict = {"allowed_cores": sorted(os.sched_getaffinity(0)), "cpu_count": os.cpu_count()}
    try:
        bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        bus_id, name = [s.strip() for s in bus.split(",", 1)]
        facts["gpu"], facts["gpu_bus"] = name, bus_id
        dev = Path("/sys/bus/pci/devices") / bus_id.lower()[-12:]  # nvidia-smi prints 8 domain digits, sysfs 4
        for f in ("local_cpulist", "numa_node"):
            if (dev / f).exists():
                facts[f"gpu_{f}"] = (dev / f).read_text().strip()
    except (OSError, IndexError, ValueError, subprocess.SubprocessError) as e:
        facts["gpu_error"] = str(e)
    for key, path in {"governor": "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
                      "cgroup_cpu_max": "/sys/fs/cgroup/cpu.max", "loadavg": "/proc/loadavg"}.items():
        try:
            facts[key] = Path(path).read_text().strip()
        except OSError:
            pass
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        facts["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln)
        facts["numa_nodes"] = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    except (OSError, StopIteration):
        pass
    return facts


def table(rows: list[dict]) -> str:
    lines = [f"{'core':>6} {'launch us':>10} {'(cpu)':>7} {'eager us':>9} {'(cpu)':>7} {'python ns':>10} {'steal':>6}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{str(r['core']):>6} error: {r['error']}")
            continue
        lines.append(f"{'any' if r['core'] is None else r['core']:>6} {r['launch_us']:10.2f} {r['launch_cpu_us']:7.2f} "
                     f"{r['eager_us']:9.2f} {r['eager_cpu_us']:7.2f} {r['python_us'] * 1e3:10.1f} "
                     f"{r['steal_ticks']:6d}")
    ok = [r for r in rows if "error" not in r]
    for key in ("launch_us", "eager_us", "python_us"):
        v = [r[key] for r in ok]
        if v:
            lines.append(f"{key}: min {min(v):.3f} median {statistics.median(v):.3f} max {max(v):.3f} "
                         f"(max/min {max(v) / min(v):.2f})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--unpinned", type=int, default=4, help="fresh unpinned processes")
    ap.add_argument("--rounds", type=int, default=2, help="passes over every core")
    ap.add_argument("--out", type=Path, default=Path("out/host_placement"))
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(None if args.child == "none" else int(args.child), args.repeats)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    print(json.dumps(facts))
    rows = []
    for rnd in range(args.rounds):
        for core in facts["allowed_cores"]:
            rows.append(dict(run_child(core, args.repeats, 120), round=rnd))
        for _ in range(args.unpinned):
            rows.append(dict(run_child(None, args.repeats, 120), round=rnd))
    (args.out / "host_placement.json").write_text(json.dumps({"machine": facts, "runs": rows}, indent=1))
    text = table(rows)
    (args.out / "host_placement.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
