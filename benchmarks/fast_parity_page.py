"""Reference vs fast greedy tokens on one bundled sample page, with the logit margins at any divergence.

    python benchmarks/fast_parity_page.py [--page square] [--steps 64] [--out FILE]

A divergence where the reference's top-1/top-2 margin is within the logit differences the two paths show on
identical histories is a bf16 rounding flip; anything else is a bug.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.measure.token_parity import compare  # noqa: E402
from dsocr_core.grounding.samples import sample_pages  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--page", default="square")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--synthetic", default="full")
    args = ap.parse_args()
    ref = Session.load(synthetic=args.synthetic, device=args.device,
                       dtype="bfloat16" if args.device == "cuda" else "float32")
    fast = ref.with_mode("fast")
    page = next(p for p in sample_pages() if p.stem == args.page)
    inputs = ref.prepare(page, mode="gundam")
    out = compare(ref, fast, inputs, args.steps)
    out.pop("reference_tokens", None)
    out.pop("fast_tokens", None)
    out["page"] = page.name
    line = json.dumps(out, default=str)
    if args.out:
        args.out.write_text(line)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
