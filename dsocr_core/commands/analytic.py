"""`analytic`: the closed-form cost of a workload (or a whole grid of them) per stage, optionally per module."""
from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np
from pydantic import ValidationError

from ..analytic.capacity import MEMORY_SCOPE
from ..engines import ENGINES, EngineSpec, options_help, parse_options
from ..registry import DEFAULT_MODEL, FAMILIES, get_family
from ..spec import DecoderSpec, SpecError, Workload


def register(sub) -> None:
    p = sub.add_parser("analytic", help="analytic FLOPs, bytes, memory and roofline time per stage",
                       description="Closed-form cost of DeepSeek-OCR inference. List-valued options (a,b,c) "
                                   "need --sweep, which writes the whole grid.")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model family: {', '.join(FAMILIES)} (default {DEFAULT_MODEL})")
    p.add_argument("--mode", help="tiling mode of the model: " + "; ".join(
        f"{f.name}: {', '.join(f.modes)} (default {f.default_mode})" for f in FAMILIES.values()))
    p.add_argument("--image", help="page size WxH in pixels (tiles chosen as the vendor does); list allowed")
    p.add_argument("--crops", help="tile grid WxH (width tiles x height tiles; 1x1 = global view only); list allowed")
    p.add_argument("--min-crops", help="smallest tile count the grid choice considers (default: the mode's, 2)")
    p.add_argument("--max-crops", help="largest tile count (default: the mode's; gundam 9 as vendor HF, vLLM uses 6; "
                                       "DeepSeek-OCR 2: 6)")
    p.add_argument("--text-tokens", default="10", help="non-image prompt tokens incl. BOS (default 10); list allowed")
    p.add_argument("--batch", default="1", help="pages per forward call (default 1); list allowed")
    p.add_argument("--decode-steps", default="0", help="generated tokens per page (default 0); list allowed")
    p.add_argument("--attn", default="sdpa", help="LM attention: eager, sdpa or flash (default sdpa)")
    p.add_argument("--logits", default="all", help="all (vendor HF: every prefill position) or last (vLLM)")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    p.add_argument("--hardware", default="h200",
                   help="GPU preset or device name (default h200); 'calibrate' measures the present CUDA GPU")
    p.add_argument("--spec", default="full", help="model preset: full (official sizes) or tiny")
    p.add_argument("--config", help="a checkpoint folder or config.json to read the model dimensions from")
    p.add_argument("--ttft-target", help="seconds: also report the TFLOP/s and TB/s a GPU needs for this TTFT")
    p.add_argument("--tpot-target", help="seconds: also report what a GPU needs for this time per output token")
    p.add_argument("--per-module", action="store_true", help="add one row per torch module")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--sweep", help="write the grid of all list values to this .csv or .json file")
    p.add_argument("--profile", help="calibration profile (python -m dsocr_core calibrate): add predicted times "
                                     "beside the roofline, in the tables and in every export")
    p.add_argument("--session-mode", default="reference",
                   help=f"the engine the prediction is for: {' or '.join(ENGINES)}")
    p.add_argument("--engine-options", metavar="JSON", help=f"with --profile: {options_help()}")
    p.add_argument("--routing", metavar="FILE",
                   help="with --profile: the MoE routing a measured run observed (a routing profile, saved with "
                        "runs RUN --save-routing FILE); default uniform routing (assumed)")
    p.add_argument("--sm-clock", metavar="MHZ",
                   help="with --profile: predict every stage at this SM clock (what-if; e.g. about 1,500-1,700 on an "
                        "H200 at its power cap under large batches); default the calibration's full clock")
    p.add_argument("--work", default="engine", help=argparse.SUPPRESS)  # engine | analytic (see analytic/predict)
    p.add_argument("--overlap", default="row", help=argparse.SUPPRESS)  # row | kernel (see analytic/predict)
    p.set_defaults(func=run)
    p.error = _parse_error  # one line and exit 2, like every other input error of this command


def _parse_error(message: str):
    print(f"error: analytic: {message} (see --help)", file=sys.stderr)
    raise SystemExit(2)


# ------------------------------------------------------------------------------------------------ parsing
def _ints(text: str, name: str) -> list[int]:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not re.fullmatch(r"-?\d+", part):
            raise SpecError(f"--{name}: {part!r} is not an integer")
        out.append(int(part))
    return out


def _pairs(text: str, name: str) -> list[tuple[int, int]]:
    out = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(-?\d+)\s*[xX*]\s*(-?\d+)\s*", part)
        if not m:
            raise SpecError(f"--{name}: {part.strip()!r} is not WxH (e.g. 2x2)")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def _number(text: str | None, name: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"--{name}: {text!r} is not a number") from None
    if not value > 0:
        raise SpecError(f"--{name} must be positive, got {text}")
    return value


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise SpecError(f"--{name}: unknown value {value!r}; choose one of {', '.join(allowed)}")
    return value


def _spec(args) -> DecoderSpec:
    fam = get_family(args.model)
    if args.config:
        return fam.spec_class.from_config_json(args.config)
    if args.spec not in fam.presets:
        raise SpecError(f"--spec: unknown model preset {args.spec!r}; choose one of {', '.join(fam.presets)}")
    return fam.preset(args.spec)


def _hardware(name: str):
    from ..hardware import calibrate, get_hardware

    return calibrate() if name.strip().lower() == "calibrate" else get_hardware(name)


def _with_profile(hw, args):
    """The hardware plus the calibration profile's prediction (--profile), or the hardware alone."""
    if not args.profile:
        for flag, given in (("--routing", args.routing), ("--sm-clock", args.sm_clock)):
            if given:
                raise SpecError(f"{flag} needs --profile: it changes the predicted time, not the roofline")
        return hw
    from ..analytic.predict import at_sm_clock, with_profile
    from ..analytic.routing import load_routing
    from ..calibration.profile import load_profile

    mode = _choice(args.session_mode, tuple(ENGINES), "session-mode")
    work = _choice(args.work, ("engine", "analytic"), "work")
    overlap = _choice(args.overlap, ("row", "kernel"), "overlap")
    engine = EngineSpec.of(mode, parse_options(args.engine_options))
    routing = load_routing(args.routing) if args.routing else None
    profile = load_profile(args.profile)
    if profile.quick:  # kept usable here (it tests the calibration end to end), never silently
        from ..analytic.known_misses import QUICK

        print(f"warning: {args.profile} is a quick profile, not a predictor: {QUICK}", file=sys.stderr)
    clock = None
    if args.sm_clock is not None:
        try:
            clock = float(args.sm_clock)
        except ValueError:
            raise SpecError(f"--sm-clock: a number of MHz, got {args.sm_clock!r}") from None
    hw = at_sm_clock(with_profile(hw, profile, engine, work, overlap, routing), clock)
    if clock is not None and hw.prediction.calibration_clock() is None:
        raise SpecError(f"--sm-clock: {args.profile} records no calibration clock (a derived or CPU profile), so "
                        "its tables cannot be moved to another clock")
    return hw


def _one_line(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(map(str, e["loc"]))
    msg = re.sub(r"^Value error, ", "", e["msg"])
    return f"invalid workload: {where + ': ' if where else ''}{msg}"


# ------------------------------------------------------------------------------------------------ output
def _print_tables(result: dict, per_module: bool) -> None:
    t = result["tokens"]
    hw = result.get("hardware", {})
    print(f"mode {t['mode']}, crops {t['crops'][0]}x{t['crops'][1]} ({t['n_tiles']} tiles), image slots "
          f"{t['image_slots']}, prompt {t['sequence']} tokens, batch {t['batch']}, decode steps {t['decode_steps']}"
          + ("" if t["within_context"] else f"  [past max_position_embeddings {t['max_position_embeddings']}]"))
    if hw:
        print(f"hardware {hw['name']}: {hw['peak_tflops']:g} TFLOP/s, {hw['bandwidth_tbs']:g} TB/s, "
              f"{hw['memory_gb']:g} GB{' (calibrated)' if hw['calibrated'] else ''}")
    from ..results.tables import format_table

    head = ["stage", "GFLOP", "other GF", "GB moved", "weights GB", "act GB", "KV GB", "weight mem GB", "peak act MB",
            "KV mem MB", "time ms", "bound"]
    rows = [[name, f"{s['tensor_flops'] / 1e9:,.1f}", f"{s['other_flops'] / 1e9:,.1f}", f"{s['bytes'] / 1e9:,.2f}",
             f"{s['weight_bytes'] / 1e9:,.2f}", f"{s['activation_bytes'] / 1e9:,.2f}", f"{s['kv_bytes'] / 1e9:,.2f}",
             f"{s['weight_memory'] / 1e9:,.2f}", f"{s['peak_activation_memory'] / 1e6:,.1f}",
             f"{s['kv_cache_memory'] / 1e6:,.1f}", f"{s.get('time_s', float('nan')) * 1e3:,.3f}", s.get("bound", "")]
            for name, s in result["stages"].items()]
    pred = result.get("prediction")
    if pred:  # the time model beside the roofline
        head += ["predicted ms", "launch ms", "host ms"]
        for row, s in zip(rows, result["stages"].values()):
            row += [f"{s['predicted_s'] * 1e3:,.3f}", f"{s['predicted_launch_s'] * 1e3:,.3f}",
                    f"{s['predicted_host_s'] * 1e3:,.3f}"]
    print(format_table(head, rows, align="l" + "r" * 10 + "l" + "r" * (3 if pred else 0)))  # never run together
    cap = result.get("capacity")
    if cap:
        print(f"TTFT {cap['ttft_s'] * 1e3:,.3f} ms, TPOT {cap['tpot_s'] * 1e3:,.4f} ms, "
              f"{cap['pages_per_s']:,.2f} pages/s = {cap['pages_per_day']:,.0f} pages/day per GPU, "
              f"memory {cap['memory_bytes'] / 1e9:,.2f} GB ({'fits' if cap['fits'] else 'does NOT fit'}; {MEMORY_SCOPE})")
    if pred:
        print(f"predicted ({pred['engine_label']} mode, {pred['label']}, routing {pred['routing']}, "
              f"{pred['clocks']}): TTFT "
              f"{cap['predicted_ttft_s'] * 1e3:,.3f} ms, TPOT {cap['predicted_tpot_s'] * 1e3:,.4f} ms, "
              f"{cap['predicted_pages_per_s']:,.2f} pages/s = {cap['predicted_pages_per_day']:,.0f} pages/day")
        for note in pred["notes"]:
            print(f"note: {note}")
    for name, req in result.get("required", {}).items():
        line = (f"{name.upper()} target {req['target_s'] * 1e3:g} ms needs >= {req['min_tflops']:,.1f} TFLOP/s "
                f"and >= {req['min_tbs']:,.3f} TB/s")
        if "scale" in req:
            line += (f"; a GPU shaped like {hw.get('name')} needs {req['scaled_tflops']:,.1f} TFLOP/s and "
                     f"{req['scaled_tbs']:,.3f} TB/s (x{req['scale']:.3g})")
        print(line)
    if per_module:
        import pandas as pd

        df = pd.DataFrame(result["modules"])
        cols = ["stage", "module", "tensor_flops", "other_flops", "bytes", "weight_memory",
                "peak_activation_memory", "kv_cache_memory"] + [c for c in ("time_s", "bound", "predicted_s")
                                                                 if c in df]
        with pd.option_context("display.max_rows", None, "display.width", 200,
                               "display.float_format", lambda v: f"{v:.4g}"):
            print(df[cols].to_string(index=False))


# ------------------------------------------------------------------------------------------------ run
def run(args) -> int:
    from ..analytic import Points, analyze, required_hardware

    fam = get_family(_choice(args.model, tuple(FAMILIES), "model"))
    mode = _choice(args.mode or fam.default_mode, tuple(fam.modes), "mode")
    info = fam.modes[mode]
    attn = _choice(args.attn, ("eager", "sdpa", "flash"), "attn")
    logits = _choice(args.logits, ("all", "last"), "logits")
    dtype = _choice(args.dtype, ("bfloat16", "float16", "float32"), "dtype")
    if args.image and args.crops:
        raise SpecError("give --image or --crops, not both")
    crops = _pairs(args.crops, "crops") if args.crops else None
    images = _pairs(args.image, "image") if args.image else None
    text, batch, steps = (_ints(args.text_tokens, "text-tokens"), _ints(args.batch, "batch"),
                          _ints(args.decode_steps, "decode-steps"))
    min_crops = _ints(args.min_crops, "min-crops")[0] if args.min_crops else info.crop_range[0]
    max_crops = _ints(args.max_crops, "max-crops")[0] if args.max_crops else info.crop_range[1]
    ttft, tpot = _number(args.ttft_target, "ttft-target"), _number(args.tpot_target, "tpot-target")
    spec = _spec(args)
    hw = _with_profile(_hardware(args.hardware), args)
    settings = dict(min_crops=min_crops, max_crops=max_crops, dtype=dtype, attn=attn, logits=logits)

    many = any(len(v) > 1 for v in (crops or [0], images or [0], text, batch, steps))
    if args.sweep:  # streamed in chunks through a temporary file: memory bounded, no partial file on failure
        from ..results.sweep_file import write_sweep_file

        n, path = write_sweep_file(spec, hw, args.sweep, mode=mode, crops=crops, images=images, text_tokens=text,
                                   batch=batch, decode_steps=steps, **settings)
        msg = {"points": n, "path": str(path), "hardware": hw.name}
        pred = getattr(hw, "prediction", None)
        if pred is not None:
            msg["prediction"] = pred.summary()
        print(json.dumps(msg) if args.json else f"wrote {n} points to {path}"
              + (f" (predicted with {pred.profile.label()}, {pred.engine.label()} engine, {pred.clock_label()})"
                 if pred is not None else ""))
        return 0
    if many:
        raise SpecError("several values given: add --sweep OUT.csv or --sweep OUT.json to evaluate the grid")

    try:
        workload = Workload(mode=mode, crops=crops[0] if crops else None, image_size=images[0] if images else None,
                            text_tokens=text[0], batch=batch[0], decode_steps=steps[0], **settings)
    except ValidationError as exc:
        raise SpecError(_one_line(exc)) from None
    Points.from_workload(workload)  # the sweep limits apply to single points too
    result = analyze(spec, workload, hw, per_module=args.per_module)
    if ttft or tpot:
        req = required_hardware(spec, Points.from_workload(workload), ttft_s=ttft, tpot_s=tpot, reference=hw)
        result["required"] = {k: {m: np.asarray(v).reshape(-1)[0].item() for m, v in d.items()}
                              for k, d in req.items()}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        _print_tables(result, args.per_module)
    return 0
