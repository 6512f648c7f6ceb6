"""The reference MoE's expert loop (model/decoder.py MoE.routed) by tokens per call: the host's time to issue it
beside the call's wall time and its kernels' device time. Where the host time is the larger, the reference LM
prefill is host-bound there, and the host time per touched expert is what the time model prices as that expert's
eager ops (3 GEMMs, 4 other launching ops, 3 views; analytic/predict.py host term, scaled by the host probe).

Each size: uniform routing (k distinct random experts per token; --zipf draws uneven loads instead), 2 warm-up
calls, the median of 5; host time is perf_counter around the call without a synchronisation after it (the loop's
.tolist() syncs on the routing's counts at its start, whose kernels are tiny), wall time with one; device time is
the sum of the kernels' times under torch.profiler in one more call. The host probe (runtime/host_speed.py) is taken
after each size.

    python benchmarks/reference_moe_host.py --tokens 64,512,2048,8192,32768,65536 --out moe_host.json
    python benchmarks/reference_moe_host.py --zipf 1.1 --tokens 2048,10000,40000 --out moe_host_skewed.json
    python benchmarks/reference_moe_host.py --device cpu --preset tiny --tokens 16,64 --out /tmp/mh.json  # smoke
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.measure.environment import capture_environment  # noqa: E402
from dsocr_core.model.decoder import MoE  # noqa: E402
from dsocr_core.registry import FAMILIES  # noqa: E402
from dsocr_core.runtime.host_speed import probe_host_op_s  # noqa: E402

WARMUP, REPEATS = 2, 5


def routing_ids(tokens: int, e: int, k: int, zipf: float, device: torch.device) -> torch.Tensor:
    """[tokens, k] distinct experts per token: uniform (zipf 0), or drawn by a popularity that falls with the
    expert's rank as rank^-zipf (ranks given to the experts in a fixed random order, so the loop, which runs in expert
    order, meets heavy and light experts mixed), as the synthetic weights' recorded loads are uneven."""
    if zipf <= 0:
        return torch.rand(tokens, e, device=device).argsort(dim=1)[:, :k].contiguous()
    popularity = torch.arange(1, e + 1, dtype=torch.float64) ** -zipf
    popularity = popularity[torch.randperm(e, generator=torch.Generator().manual_seed(0))]
    ids = torch.multinomial(popularity.expand(tokens, e), k, replacement=False,
                            generator=torch.Generator().manual_seed(1))
    return ids.to(device).contiguous()


def measure(moe: MoE, tokens: int, device: torch.device, zipf: float = 0.0) -> dict:
    e, k = len(moe.experts), moe.k
    hidden = moe.experts[0].gate_proj.in_features
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    x = torch.randn(tokens, hidden, device=device, dtype=moe.experts[0].gate_proj.weight.dtype)
    ids = routing_ids(tokens, e, k, zipf, device)
    weights = torch.rand(tokens, k, device=device)
    host, wall = [], []
    with torch.no_grad():
        for i in range(WARMUP + REPEATS):
            sync()
            t0 = time.perf_counter()
            moe.routed(x, weights, ids)
            t1 = time.perf_counter()
            sync()
            if i >= WARMUP:
                host.append(t1 - t0)
                wall.append(time.perf_counter() - t0)
        busy = None
        if device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                moe.routed(x, weights, ids)
                sync()
            busy = sum(ev.device_time_total for ev in prof.events()
                       if ev.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    loads = torch.bincount(ids.reshape(-1), minlength=e)
    touched = int(loads.gt(0).sum())
    row = dict(tokens=tokens, zipf=zipf, touched=touched, largest_share=float(loads.max()) / (tokens * k), host_s=statistics.median(host), wall_s=statistics.median(wall),
               device_busy_s=busy, probe_op_s=probe_host_op_s(device))
    row["host_us_per_expert"] = row["host_s"] / touched * 1e6
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,512,2048,8192,32768,65536", help="tokens per call, comma-separated")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of the script")
    ap.add_argument("--preset", default="full", choices=["full", "tiny"], help="the model's widths")
    ap.add_argument("--zipf", type=float, default=0.0,
                    help="routing skew: expert popularity ~ rank^-ZIPF (0: uniform routing)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file written with every number")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --device cpu --preset tiny for a smoke test)")
    try:
        sizes = [int(v) for v in args.tokens.split(",")]
    except ValueError:
        raise SystemExit(f"--tokens takes whole numbers separated by commas, got {args.tokens!r}") from None
    device = torch.device(args.device)
    torch.manual_seed(0)
    spec = FAMILIES["deepseek-ocr"].preset(args.preset)
    moe = MoE(spec).to(device, torch.bfloat16).eval()  # random weights: the loop's work does not depend on them
    rows = []
    for t in sizes:
        r = measure(moe, t, device, args.zipf)
        rows.append(r)
        busy = "-" if r["device_busy_s"] is None else f"{r['device_busy_s'] * 1e3:7.2f}"
        probe = "-" if r["probe_op_s"] is None else f"{r['probe_op_s'] * 1e6:.1f}"
        print(f"tokens {t:6d}  experts {r['touched']:3d} (largest {r['largest_share']:.0%})  host {r['host_s'] * 1e3:7.2f} ms  wall "
              f"{r['wall_s'] * 1e3:7.2f} ms  device {busy} ms  host per expert {r['host_us_per_expert']:6.1f} us  "
              f"probe {probe} us", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "reference_moe_host", "environment": capture_environment(device.type),
                                    "preset": args.preset, "warmup": WARMUP, "repeats": REPEATS, "rows": rows},
                                   indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
