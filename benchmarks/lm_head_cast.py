"""The lm_head of a prefill, kernel by kernel: its GEMM [rows, 1280] x [1280, 129,280] and the cast of its logits to
float32 (`.float()`, what both engines run after it), timed with CUDA events (median of 7 after 3 warm-ups:
grouped_gemm_steps.median_s), beside the time model's price of each kernel under a calibration profile.

Why: with every prompt position's logits (the measure command's and the vendor's default) the fast LM prefill was
under-predicted by 12-20%; the plan hid the cast under the GEMM's compute and priced it as an elementwise add. On an
H100 the cast streams at about 1.9 TB/s (0.58 of HBM) where the add reaches 3.0, and at 36,558 rows (54 Large pages)
it takes 14.5 ms beside the GEMM's 18.3.

    python benchmarks/lm_head_cast.py --profile data/profiles/h100.json --out out/lm_head_cast.json
    python benchmarks/lm_head_cast.py --device cpu --rows 8,64 --out /tmp/lm_head_cast.json   # smoke test
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from grouped_gemm_steps import median_s  # noqa: E402

from dsocr_core.spec import ModelSpec  # noqa: E402

HIDDEN, VOCAB = ModelSpec().hidden_size, ModelSpec().vocab_size  # DeepSeek-OCR's LM
DEFAULT_ROWS = "54,703,5000,14088,36558"  # a batch's last positions; one page's prompt; up to 54 Large pages
REPEATS = 7


def predicted(profile_path: str, rows: int) -> dict[str, float]:
    """The plan's seconds of the lm_head's two kernels at `rows` logit rows (device time: table efficiency and one
    launch each, as the predictor prices them)."""
    from dsocr_core.analytic.kernels import Call, lm_head_and_cast
    from dsocr_core.analytic.predict import Prediction, Predictor
    from dsocr_core.calibration.profile import load_profile
    from dsocr_core.engines import EngineSpec
    spec = ModelSpec()
    pred = Predictor(Prediction(load_profile(profile_path), EngineSpec.of("fast")))
    plan = lm_head_and_cast(Call("lm.lm_head", None, {"spec": spec, "dt": 2, "logit_rows": rows}, "", None))
    out = {name: float(pred.kernel_s(k, "bfloat16")) for name, k in zip(("gemm_s", "cast_s"), plan.kernels)}
    out["tables"] = [pred.table_name(k.table, "bfloat16") for k in plan.kernels]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default=DEFAULT_ROWS, help=f"logit rows (default {DEFAULT_ROWS})")
    ap.add_argument("--profile", help="also print the time model's price of each kernel under this profile")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("lm_head_cast.py --device cuda needs a CUDA GPU (or pass --device cpu)")
    dtype = torch.bfloat16
    w = torch.randn(VOCAB, HIDDEN, device=device, dtype=dtype) * 0.02
    rows_out = []
    for m in (int(r) for r in args.rows.split(",") if r.strip()):
        x = torch.randn(m, HIDDEN, device=device, dtype=dtype)
        y = F.linear(x, w)
        row = {"rows": m, "gemm_s": median_s(lambda: F.linear(x, w), REPEATS, device),
               "cast_s": median_s(lambda: y.float(), REPEATS, device),
               "both_s": median_s(lambda: F.linear(x, w).float(), REPEATS, device)}
        row["cast_tb_s"] = m * VOCAB * 6 / row["cast_s"] / 1e12
        if args.profile:
            row["predicted"] = predicted(args.profile, m)
        rows_out.append(row)
        line = (f"rows {m:6d}: gemm {row['gemm_s'] * 1e3:8.3f} ms  cast {row['cast_s'] * 1e3:8.3f} ms "
                f"({row['cast_tb_s']:.2f} TB/s)  both {row['both_s'] * 1e3:8.3f} ms")
        if args.profile:
            p = row["predicted"]
            line += f"  | predicted gemm {p['gemm_s'] * 1e3:8.3f} ms, cast {p['cast_s'] * 1e3:8.3f} ms ({p['tables'][1]})"
        print(line, flush=True)
        del x, y
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "hidden": HIDDEN, "vocab": VOCAB, "dtype": "bfloat16",
              "profile": args.profile, "rows": rows_out}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
