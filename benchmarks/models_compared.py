"""DeepSeek-OCR vs DeepSeek-OCR 2 on a GPU: the same page sizes through both full-size models (synthetic bf16
weights, SDPA, the reference session mode, each model tiling the page its own way), every stage measured (median of
the repeats) beside the roofline bound and the time the calibration profile predicts. One run store per model (kind
`reference`, exported as JSON), and a markdown table per page with both models' stages side by side.

    python benchmarks/models_compared.py --out OUT [--profile data/profiles/h200.json] [--pages 1920x1080,...]
    python benchmarks/models_compared.py --out OUT --device cpu --preset tiny --steps 2 --repeats 1   # smoke test
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from dsocr_core.analytic.predict import profile_hardware, with_profile  # noqa: E402
from dsocr_core.calibration.profile import load_profile  # noqa: E402
from dsocr_core.measure.sweep import free_memory, run_sweep  # noqa: E402
from dsocr_core.registry import FAMILIES, stage_names  # noqa: E402
from dsocr_core.results.analytic_join import compare_run  # noqa: E402
from dsocr_core.results.store import RunStore  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.spec import Workload  # noqa: E402

PAGES = "1920x1080,1024x1024,1191x1684,800x600,640x480"


def measure_model(name: str, pages: list[tuple[int, int]], args) -> tuple[RunStore, str]:
    """One model's pages measured into its own store (OUT/<model>.sqlite, exported as OUT/<model>.json)."""
    fam = FAMILIES[name]
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    session = Session.load(synthetic=args.preset, model=name, device=args.device, dtype=dtype)
    store = RunStore(args.out / f"{name}.sqlite")
    workloads = [Workload(mode=fam.default_mode, image_size=p, text_tokens=args.text_tokens, decode_steps=args.steps,
                          dtype=dtype) for p in pages]
    run_id = run_sweep(session, store, workloads, name=f"{fam.label}: pages compared (synthetic {args.preset}, "
                                                       f"{dtype}, sdpa)",
                       repeats=args.repeats, warmup=1, kind="reference",
                       progress=lambda i, n, w, s: print(f"  [{name} {i}/{n}] {w.image_size}: {s}", flush=True))
    store.export_run(run_id, args.out / f"{name}.json")
    del session
    free_memory(torch.device(args.device))
    return store, run_id


def stored_model(name: str, args) -> tuple[RunStore, str]:
    """The newest run of OUT/<model>.sqlite, measured earlier (--from-stores: re-predicted without measuring)."""
    path = args.out / f"{name}.sqlite"
    if not path.exists():
        raise SystemExit(f"--from-stores: {path} is missing (measure first, without --from-stores)")
    store = RunStore(path)
    runs = [r for r in store.list_runs("reference") if r["n_points"] and r["n_done"] == r["n_points"]]
    if not runs:
        raise SystemExit(f"--from-stores: {path} holds no finished measured run")
    return store, runs[0]["id"]  # newest first


def joined(name: str, store: RunStore, run_id: str, hw) -> pd.DataFrame:
    """The run's stages joined with the roofline and the profile's prediction, one row per page and stage."""
    rows = compare_run(store, run_id, prediction=hw)
    page = rows["point"].map(lambda key: "x".join(map(str, json.loads(key)["image_size"])))
    return rows.assign(model=FAMILIES[name].label, page=page)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", type=Path, default=Path("data/profiles/h200.json"))
    ap.add_argument("--pages", default=PAGES, help="comma-separated WIDTHxHEIGHT page sizes")
    ap.add_argument("--text-tokens", type=int, default=10)
    ap.add_argument("--steps", type=int, default=32, help="decode steps per page")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of the script")
    ap.add_argument("--preset", default="full", choices=["full", "tiny"], help="synthetic weights preset")
    ap.add_argument("--from-stores", action="store_true",
                    help="measure nothing: re-predict the runs OUT already holds with --profile (no GPU needed)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available() and not args.from_stores:
        raise SystemExit("needs a CUDA GPU (or --device cpu --preset tiny for a smoke test)")
    args.out.mkdir(parents=True, exist_ok=True)
    pages = [tuple(int(v) for v in p.split("x")) for p in args.pages.split(",") if p.strip()]
    profile = load_profile(args.profile)
    hw = with_profile(profile_hardware(profile), profile, "reference")
    t0 = time.time()
    frames, gpus = [], set()
    for name in FAMILIES:
        store, run_id = stored_model(name, args) if args.from_stores else measure_model(name, pages, args)
        frames.append(joined(name, store, run_id, hw))
        gpus.add(store.get_run(run_id)["environment"].get("gpu_name") or "the CPU (smoke test)")
    both = pd.concat(frames, ignore_index=True)
    keep = ["page", "model", "grid", "sequence", "stage", "measured_s", "predicted_datasheet_s", "predicted_s",
            "time_err_predicted", "measured_tensor_flops", "flop_rel_diff"]
    shown = [s for s in stage_names() if s != "decode"] + ["decode_step"]  # every family's stages (registry)
    both = both[both["stage"].isin(shown)]
    both[keep].to_csv(args.out / "models_compared.csv", index=False)
    took = "re-predicted from the stored runs" if args.from_stores else f"{time.time() - t0:.0f} s"
    lines = [f"# DeepSeek-OCR vs DeepSeek-OCR 2 on {' and '.join(sorted(gpus))} ({took})",
             (f"synthetic {args.preset} weights; profile {args.profile}; {args.text_tokens} text tokens; decode "
              f"step = median over {args.steps} steps" if not args.from_stores else
              f"profile {args.profile}; the stored runs' own weights, text tokens and decode steps (their JSON)"),
             "", "| page | model | grid | prompt | stage | measured ms | roofline ms | predicted ms | pred err |",
             "|---|---|---|---|---|---|---|---|---|"]
    def ms(v) -> str:
        return "n/a" if v is None or pd.isna(v) else f"{v * 1e3:.3f}"

    for r in both.itertuples():
        err = "n/a" if r.time_err_predicted is None or pd.isna(r.time_err_predicted) else f"{r.time_err_predicted:+.0%}"
        lines.append(f"| {r.page} | {r.model} | {r.grid} | {r.sequence} | {r.stage} | {ms(r.measured_s)} | "
                     f"{ms(r.predicted_datasheet_s)} | {ms(r.predicted_s)} | {err} |")
    (args.out / "models_compared.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    (args.out / "models_compared.json").write_text(json.dumps(both[keep].to_dict(orient="records"), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
