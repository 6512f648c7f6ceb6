"""`samples`: draw the project's own sample pages (PNG + grounding text + index.json)."""
from pathlib import Path

from ..grounding.samples import DEFAULT_DIR, PAGES, write_samples


def register(sub) -> None:
    p = sub.add_parser("samples", help="draw the bundled sample pages and their grounding text")
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"output folder (default {DEFAULT_DIR})")
    p.set_defaults(func=run)


def run(args) -> int:
    records = write_samples(args.out, PAGES)
    for r in records:
        hf, vl = r["gundam_hf"], r["gundam_vllm"]
        print(f"{r['name']:<12} {r['width']}x{r['height']:<5} {len(r['blocks'])} blocks  "
              f"gundam grid {hf['grid'][0]}x{hf['grid'][1]} ({hf['image_slots']} slots; "
              f"vLLM {vl['grid'][0]}x{vl['grid'][1]}, {vl['image_slots']})")
    print(f"wrote {len(records)} pages to {args.out}")
    return 0
