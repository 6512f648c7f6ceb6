"""How the fast engine's grouped expert GEMM's time grows with the rows each expert gets: in steps, not smoothly.

The prefill runs each MoE layer's experts as two grouped GEMMs (torch._grouped_mm, CUTLASS) over the rows sorted
by expert. The time model looks them up in the calibration's `grouped_gemm` table at the mean rows per expert.
On an H200 the kernel's time is nearly flat from 129 to 256 rows per expert and jumps by 1.6x at 257 (docs/
fast-mode.md, "The grouped GEMMs' steps"), so a table measured at powers of two (the kernel's best sizes)
prices the sizes between them as fast as the best ones. This times the gate/up GEMM (n 1,792, k 1,280) and the
down GEMM (n 1,280, k 896) of 64 experts with the same rows each, over a range of rows, eagerly and replayed from
a CUDA graph (as the calibration and the engine run them), and prints each time and its efficiency on the
datasheet's peak.

    python benchmarks/grouped_gemm_steps.py --rows 128,192,256,288,320,384,512,768,1024,1320,1536 --out out/gg.json
    python benchmarks/grouped_gemm_steps.py --device cpu --quick --out /tmp/gg.json     # smoke test (tiny sizes)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def grouped(rows: int, experts: int, n: int, k: int, device: torch.device, dtype, gen):
    """A zero-argument call of one grouped GEMM: `experts` groups of `rows` rows each."""
    ends = torch.arange(1, experts + 1, device=device, dtype=torch.int32) * rows
    x = torch.randn(experts * rows, k, device=device, dtype=dtype, generator=gen)
    w = torch.randn(experts, n, k, device=device, dtype=dtype, generator=gen)
    if hasattr(torch, "_grouped_mm") and device.type == "cuda":
        return lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=ends)
    return lambda: torch.bmm(x.view(experts, rows, k), w.transpose(1, 2))  # the CPU stand-in


def graphed(fn):
    """The same call replayed from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
        with torch.cuda.graph(graph):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph.replay


def median_s(fn, repeats: int, device: torch.device) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            import time
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="64,128,192,256,288,320,384,512,768,1024,1320,1536,2048",
                    help="rows per expert (comma list)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, float32 (CPU smoke test)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --quick", file=sys.stderr)
        return 2
    from dsocr_core.hardware import match_device_name
    from dsocr_core.measure.environment import capture_environment

    dtype = torch.float32 if args.quick else torch.bfloat16
    shapes = {"gate_up": (64, 32), "down": (32, 64)} if args.quick else {"gate_up": (1792, 1280), "down": (1280, 896)}
    preset = match_device_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    peak = preset.peak_flops if preset is not None else None
    gen = torch.Generator(device=device).manual_seed(0)
    rows_out = []
    for rows in (int(r) for r in args.rows.split(",") if r):
        row = {"rows": rows}
        for name, (n, k) in shapes.items():
            fn = grouped(rows, args.experts, n, k, device, dtype, gen)
            flops = 2.0 * args.experts * rows * n * k
            for how, call in (("eager", fn), ("graph", graphed(fn) if device.type == "cuda" else None)):
                if call is None:
                    continue
                s = median_s(call, args.repeats, device)
                row[f"{name}_{how}_s"] = s
                row[f"{name}_{how}_efficiency"] = flops / s / peak if peak else None
            del fn
        rows_out.append(row)
        print(f"{rows:6d} rows/expert: " + "  ".join(
            f"{name} {how} {row[f'{name}_{how}_s'] * 1e6:8.1f} us"
            + (f" ({row[f'{name}_{how}_efficiency']:.2f})" if row.get(f"{name}_{how}_efficiency") else "")
            for name in shapes for how in ("eager", "graph") if f"{name}_{how}_s" in row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "grouped_gemm_steps", "environment": capture_environment(device),
                                    "experts": args.experts, "peak_flops": peak, "points": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
