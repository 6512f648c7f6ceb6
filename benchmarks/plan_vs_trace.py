"""What the reference engine really runs, row by row, against what the time model prices for the same rows.

One workload through the reference engine (synthetic weights and inputs; a warm-up run, then one run under
torch.profiler with a range per analytic row and per stage: dsocr_core/measure/row_trace.py). Per stage and row:
the measured time (CUDA: the device time of the kernels the row's modules launched; CPU: the aten ops' self CPU
time), the kernels and their names, beside the reference plan's launches, the predicted device time and the
predicted host time beyond it, from a calibration profile. Rows are grouped as runtime/op_count.py groups them (a block's own code is filed under
one of its rows by the plan), so a group's numbers compare like for like and its members show where time goes.
Prints a table per stage (each row's top 3 measured kernels under it) and writes everything to --out.

    python benchmarks/plan_vs_trace.py --mode gundam --grid 1x1 --batch 1 --text-tokens 10 --decode-steps 2 \\
        --profile data/profiles/h100.json --out plan_vs_trace_h100.json
    python benchmarks/plan_vs_trace.py --device cpu --preset tiny --mode tiny --out /tmp/pvt.json   # smoke test
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.calibration.profile import load_profile  # noqa: E402
from dsocr_core.measure.row_trace import format_table, plan_vs_trace  # noqa: E402
from dsocr_core.model import synthetic_model  # noqa: E402
from dsocr_core.registry import FAMILIES  # noqa: E402


def parse_grid(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid must be WxH (e.g. 2x1), got {text!r}") from None
    return w, h


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": device,
           "host": platform.node()}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   capability=".".join(map(str, torch.cuda.get_device_capability())))
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="gundam", help="vision mode (gundam, tiny, small, base, large)")
    ap.add_argument("--grid", type=parse_grid, default=(1, 1), help="crop grid WxH (tiled modes)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--text-tokens", type=int, default=10, help="prompt text tokens (BOS included)")
    ap.add_argument("--decode-steps", type=int, default=2)
    ap.add_argument("--profile", type=Path, default=Path("data/profiles/h100.json"),
                    help="calibration profile that predicts the times")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of the script")
    ap.add_argument("--preset", default="full", choices=["full", "tiny"], help="synthetic weights preset")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="the model's attention")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="JSON file written with every number")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --device cpu --preset tiny for a smoke test)")

    profile = load_profile(args.profile)
    spec = FAMILIES["deepseek-ocr"].preset(args.preset)
    t0 = time.time()
    model = synthetic_model(spec, seed=args.seed, dtype="bfloat16", device=args.device, attn_impl=args.attn)
    loaded = time.time() - t0
    result = plan_vs_trace(model, profile, args.mode, args.grid, args.batch, args.text_tokens, args.decode_steps)
    result.update(environment=environment(args.device), profile=str(args.profile), preset=args.preset,
                  attn=args.attn, dtype="bfloat16", seconds={"load": loaded, "run": time.time() - t0 - loaded})
    table = format_table(result)
    where = result["environment"].get("gpu", "the CPU (smoke test)")
    print(f"# plan vs trace on {where}: {args.mode} {args.grid[0]}x{args.grid[1]}, batch {args.batch}, "
          f"{args.text_tokens} text tokens, {args.decode_steps} decode steps; synthetic {args.preset}, bf16, "
          f"{args.attn}; profile {args.profile}")
    print(table)
    if result["device"] == "cuda":
        print(f"\ndevice time the profiler linked to no op: {result['unattributed_device_ms']:.3f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**result, "table": table}, indent=1, default=str) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
