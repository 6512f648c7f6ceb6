"""Where the fast engine's prefill time goes, kernel by kernel, as the page grows: SAM, CLIP, the projector and
the LM prefill of several pages (Gundam tile grids, native modes, batches, text lengths), each stage timed in its
CUDA graph (the engine's default, medians over repeats) and once more with graphs off under torch.profiler, its
kernels listed with their device time per prefill, beside the time model's prediction of the stage from a
calibration profile.

Why: the measured CLIP of Gundam pages is a step function of the tile count (on an H100, 4 tiles 2.03 ms, 5 tiles
1.89 ms, 7-9 tiles 2.31-2.34 ms) while the prediction grows smoothly; the projector grows by more per tile than
the plan has. The kernel lists show which kernels make the steps. Since 2026-11-27 it also covers SAM (whose error
follows the view size: 512-640 px views under-predicted, 1024-1280 px over-predicted) and the LM prefill (batched
prefills under-predicted by 8-20% in one held-out set), and a point may set its text length.

    python benchmarks/vision_kernels.py --profile data/profiles/h100.json --out out/vision_kernels.json
    python benchmarks/vision_kernels.py --stages sam,prefill --points tiny:1x1:b4:t78,base --out out/vk.json
    python benchmarks/vision_kernels.py --device cpu --quick --out /tmp/vk.json     # smoke test (tiny model)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.registry import DEFAULT_MODEL, get_family  # noqa: E402

STAGES = (*get_family(DEFAULT_MODEL).vision_stages, "prefill")  # every stage a prefill times
DEFAULT_STAGES = "clip,projector"
DEFAULT_POINTS = "gundam:1x1,gundam:2x2,gundam:5x1,gundam:3x2,gundam:3x3,small:1x1:b8,base:1x1"


def parse_point(text: str) -> dict:
    """mode:WxH[:bN][:tN] -> {mode, grid, batch, text_tokens} (batch 1 and 10 text tokens unless given)."""
    parts = text.split(":")
    try:
        w, h = (int(v) for v in parts[1].lower().split("x")) if len(parts) > 1 else (1, 1)
        extra = {"b": 1, "t": 10}
        for part in parts[2:]:
            if part[:1] not in extra or len(parts) > 4:
                raise ValueError(text)
            extra[part[0]] = int(part[1:])
        if parts[2:] and [p[0] for p in parts[2:]] not in (["b"], ["t"], ["b", "t"]) or min(extra.values()) < 1:
            raise ValueError(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"a point is mode:WxH[:bN][:tN] (e.g. gundam:3x2:b4:t500), got {text!r}"
                                         ) from None
    from dsocr_core.registry import all_modes

    if parts[0] not in all_modes():
        raise argparse.ArgumentTypeError(f"unknown mode {parts[0]!r} in {text!r}; choose one of "
                                         f"{', '.join(all_modes())}")
    return {"mode": parts[0], "grid": (w, h), "batch": extra["b"], "text_tokens": extra["t"]}


def point_arguments(ap: argparse.ArgumentParser, points: str, repeats: int, repeats_help: str) -> None:
    """The arguments the point benchmarks share (this one, stage_boundaries, stage_clocks): --points, --device,
    --quick, --repeats and the required --out."""
    ap.add_argument("--points", default=points, help="comma list of mode:WxH[:bN][:tN] (default %(default)s)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny synthetic model, float32 (CPU smoke test)")
    ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    ap.add_argument("--out", type=Path, required=True)


def parse_stages(text: str) -> tuple[str, ...]:
    stages = tuple(s for s in text.split(",") if s)
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise argparse.ArgumentTypeError(f"stages are a comma list of {', '.join(STAGES)}, got {text!r}")
    return stages


def stage_medians(session, inputs, repeats: int, stages=STAGES) -> dict[str, float]:
    """Median seconds of each of `stages` over `repeats` prefills (the timer's CUDA events)."""
    from dsocr_core.runtime.timing import StageTimer

    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        timer = StageTimer(session.device)
        session.prefill(inputs, timer=timer)
        for name, s in timer.finish():
            times.setdefault(name, []).append(s)
    return {k: statistics.median(v) for k, v in times.items() if k in stages}


def stage_kernels(session, inputs, passes: int, stages=STAGES) -> dict[str, list[dict]]:
    """Per stage, the kernels of `passes` prefills under torch.profiler: name, launches and device us per
    prefill, largest first."""
    from torch.profiler import ProfilerActivity, profile

    from dsocr_core.measure.operators import ProfiledStageTimer, group_events

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(passes):
            session.prefill(inputs, timer=ProfiledStageTimer(session.device))
        if session.device.type == "cuda":
            torch.cuda.synchronize(session.device)
    ops, _ = group_events(prof.events())
    dev = "cuda" if session.device.type == "cuda" else "cpu"
    out = {}
    for stage in stages:
        rows = ops[(ops.stage == stage) & (ops.device == dev)].sort_values("self_us", ascending=False)
        out[stage] = [{"kernel": r.operator, "launches": r.calls / passes, "us": r.self_us / passes}
                      for r in rows.itertuples()]
    return out


def _prediction_inputs(profile_path: str, point: dict, spec_preset: str, dtype: str, engine=None):
    """(model spec, workload, profiled hardware) of one point on `engine` (an EngineSpec; None: the fast defaults)."""
    from dsocr_core.analytic.predict import profile_hardware, with_profile
    from dsocr_core.calibration.profile import load_profile
    from dsocr_core.registry import get_family
    from dsocr_core.spec import Workload
    from dsocr_core.tiling import mode_info

    prof = load_profile(profile_path)
    spec = get_family(None).presets[spec_preset]()
    w = Workload(mode=point["mode"], crops=point["grid"] if mode_info(point["mode"]).crop_mode else None,
                 batch=point["batch"], text_tokens=point.get("text_tokens", 10), decode_steps=1, logits="last",
                 dtype=dtype)
    return spec, w, with_profile(profile_hardware(prof), prof, engine or "fast")


def predicted(profile_path: str | None, point: dict, spec_preset: str, dtype: str,
              engine=None, stages=STAGES) -> dict[str, float] | None:
    """The time model's `stages` of one point on `engine` (an EngineSpec; None: the fast defaults)."""
    if not profile_path:
        return None
    from dsocr_core.results.prediction_check import predicted_stages

    spec, w, hw = _prediction_inputs(profile_path, point, spec_preset, dtype, engine)
    return {k: v for k, v in predicted_stages(spec, [w], hw)[0].items() if k in stages}


def predicted_rows(profile_path: str | None, point: dict, spec_preset: str, dtype: str, engine=None,
                   stages=STAGES) -> dict[str, dict[str, float]] | None:
    """The same prediction by analytic row kind (e.g. sam.attn.global, lm.mlp.experts): {stage: {kind: seconds}},
    to set beside the kernels (the rows of all layers of a kind summed)."""
    if not profile_path:
        return None
    from dsocr_core.analytic.api import module_table

    table = module_table(*_prediction_inputs(profile_path, point, spec_preset, dtype, engine))
    table = table[table.stage.isin(stages)]
    sums = table.groupby(["stage", "kind"])["predicted_s"].sum()
    return {st: {k: float(v) for (s2, k), v in sums.items() if s2 == st} for st in stages}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    point_arguments(ap, DEFAULT_POINTS, 10, "timed prefills per point (graphs on)")
    ap.add_argument("--stages", default=DEFAULT_STAGES,
                    help=f"comma list of the stages to time and list, of {', '.join(STAGES)} (default %(default)s)")
    ap.add_argument("--profile", help="calibration profile for the predicted column")
    ap.add_argument("--top", type=int, default=8, help="kernels printed per stage")
    ap.add_argument("--engine-options", default="",
                    help='fast engine options as JSON, e.g. \'{"projector_layout": "per_image"}\' (measured and '
                         'predicted with them)')
    ap.add_argument("--graphed-kernels", action="store_true",
                    help="also list the kernels of the graphed stages (their replays under the profiler): a "
                         "graphed stage's time beside its kernels' says what the graph adds (where no kernel is tied "
                         "to a stage in the graphed run, as on an H100 of 2026-11-28, it says so)")
    args = ap.parse_args(argv)

    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    try:
        points = [parse_point(p) for p in args.points.split(",") if p]
        stages = parse_stages(args.stages)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    preset = "tiny" if args.quick else "full"
    dtype = "float32" if args.quick else "bfloat16"
    base = Session.load(synthetic=preset, device=args.device, dtype=dtype)
    from dsocr_core.engines import EngineSpec, parse_options
    from dsocr_core.spec import SpecError

    try:
        opts = parse_options(args.engine_options)
        engine = EngineSpec.of("fast", opts)  # validated, every option recorded
    except SpecError as exc:
        ap.error(str(exc))
    graphed, eager = base.with_mode("fast", **opts), base.with_mode("fast", **{**opts, "graphs": False})
    result = {"benchmark": "vision_kernels", "environment": capture_environment(args.device),
              "engine": engine.to_dict(),
              "weights": "synthetic " + preset, "dtype": dtype, "profile": args.profile, "stages": list(stages),
              "points": []}
    for p in points:
        inputs = synthetic_inputs(p["mode"], p["grid"], text_tokens=p["text_tokens"], batch=p["batch"], seed=1,
                                  dtype=base.torch_dtype, device=base.device)
        for s in (graphed, eager):  # warm-up: compile, capture
            for _ in range(2):
                s.prefill(inputs)
        # the same stages launched eagerly, timed the same way: beside the graphed time and the kernels' own, it
        # says whether a stage's time beyond its kernels comes from the graph (on 2026-11-26 the projector of
        # 1280 px pages at batch 10 took 117 us graphed against 69 us of kernels)
        row = {**p, "measured_s": stage_medians(graphed, inputs, args.repeats, stages),
               "measured_eager_s": stage_medians(eager, inputs, args.repeats, stages),
               "kernels": stage_kernels(eager, inputs, 3, stages),
               "predicted_s": predicted(args.profile, p, preset, dtype, engine, stages),
               "predicted_rows": predicted_rows(args.profile, p, preset, dtype, engine, stages)}
        if args.graphed_kernels:
            row["kernels_graphed"] = stage_kernels(graphed, inputs, 3, stages)
        result["points"].append(row)
        label = f"{p['mode']} {p['grid'][0]}x{p['grid'][1]} b{p['batch']} t{p['text_tokens']}"
        for stage in stages:
            ks = row["kernels"][stage]
            pred = row["predicted_s"][stage] * 1e3 if row["predicted_s"] else float("nan")
            print(f"== {label} {stage}: graphed {row['measured_s'][stage] * 1e3:.3f} ms, eager "
                  f"{row['measured_eager_s'][stage] * 1e3:.3f} ms, kernels "
                  f"{sum(k['us'] for k in ks) / 1e3:.3f} ms ({sum(k['launches'] for k in ks):.0f} launches), "
                  f"predicted {pred:.3f} ms", flush=True)
            for k in ks[:args.top]:
                print(f"   {k['us']:9.1f} us x{k['launches']:<4.0f} {k['kernel'][:110]}")
            graphed_ks = row.get("kernels_graphed", {}).get(stage)
            for k in (graphed_ks or [])[:args.top]:
                print(f"   graphed {k['us']:9.1f} us x{k['launches']:<4.0f} {k['kernel'][:100]}")
            if graphed_ks == []:  # on an H100 of 2026-11-28 none were: replays' kernels fall outside the stage ranges
                print("   graphed: no kernels were tied to this stage in the graphed run")
            rows = sorted((row["predicted_rows"] or {}).get(stage, {}).items(), key=lambda kv: -kv[1])
            for kind, sec in rows[:args.top]:
                print(f"   predicted {sec * 1e6:9.1f} us  {kind}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    print("\npoint                       " + "  ".join(f"{s + ' meas/pred ms':>24s}" for s in stages))
    for r in result["points"]:
        cells = []
        for s in stages:
            pr = r["predicted_s"][s] * 1e3 if r["predicted_s"] else float("nan")
            cells.append(f"{r['measured_s'][s] * 1e3:11.3f} / {pr:9.3f}")
        print(f"{r['mode']:7s} {r['grid'][0]}x{r['grid'][1]} b{r['batch']:<3d} t{r['text_tokens']:<5d}      "
              + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
