"""Batch-1 decode of the fast engine with variants of its fused kernels, timed in alternating rounds on one GPU.

Each variant is a version of `dsocr_core/fast/decode_kernels.py` (the checkout's, or a copy of another version
given by path) with optional block overrides (`FastEngine(fused_blocks=...)`). Every round runs every variant once
in turn (prefill of a 2x2 Gundam page, then `--steps` greedy tokens with the n-gram ban; the time per token is the
decode loop's span over its tokens, launch gaps included, as `session_speed.py` measures it), so drift of the GPU
hits every variant alike; the figure per variant is the median over rounds. Each variant's greedy tokens must be
the same in every round (a launch-order race shows as tokens that change between runs), and are compared with the
first variant's: the first position where they differ, if any (a different reduction order can flip a near-tie).

    python benchmarks/decode_b1_variants.py --variant before=/tmp/old_decode_kernels.py \\
        --variant now --variant 'shared4={"shared_up": [4, 2048, 0]}' --out out/decode_b1_variants.json

A variant is NAME, NAME=PATH (another decode_kernels.py), NAME=JSON (block overrides) or NAME=PATH@JSON.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from session_speed import ceilings, fast_generate_times, med, page_inputs  # noqa: E402

from dsocr_core.analytic import decode_floor  # noqa: E402
from dsocr_core.fast import engine as engine_module  # noqa: E402
from dsocr_core.measure.environment import capture_environment  # noqa: E402
from dsocr_core.model.checkpoint import synthetic_model  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.runtime.tokenizer import load_tokenizer  # noqa: E402
from dsocr_core.spec import ModelSpec  # noqa: E402

CURRENT = engine_module.FusedDecode


def parse_variant(text: str) -> dict:
    """NAME[=PATH][@JSON] or NAME=JSON -> {'name', 'path' or None, 'blocks'}."""
    name, _, rest = text.partition("=")
    path, blocks = None, {}
    if rest.startswith("{"):
        blocks = json.loads(rest)
    elif rest:
        path, _, js = rest.partition("@")
        blocks = json.loads(js) if js else {}
        if not Path(path).is_file():
            raise SystemExit(f"variant {name!r}: no file {path}")
    return {"name": name, "path": path, "blocks": {k: tuple(v) for k, v in blocks.items()}}


def fused_class(path: str | None):
    """FusedDecode of the checkout, or of another decode_kernels.py (imported as its own module, with the
    checkout's triton_kernels)."""
    if path is None:
        return CURRENT
    src = Path(path).read_text().replace("from .triton_kernels import", "from dsocr_core.fast.triton_kernels import")
    name = f"decode_kernels_{abs(hash(path))}"
    folder = Path("/tmp") / name
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(src)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # triton.jit reads the module's globals through sys.modules
    spec.loader.exec_module(mod)
    return mod.FusedDecode


def run_variant(fast, v: dict, page, steps: int, ngram: int) -> dict:
    """Switch the engine to the variant (a fresh batch-1 state: its graphs are captured again), warm up, time."""
    eng = fast.engine
    engine_module.FusedDecode = v["cls"]
    eng.fused_blocks = v["blocks"]
    eng.release(1)
    fast_generate_times(fast, page, steps, ngram)  # warm-up: compiles and captures every bucket
    r = fast_generate_times(fast, page, steps, ngram)
    st = eng._states[1]
    t = page.input_ids.shape[1]
    tokens = st.history[0, t:t + steps].tolist()
    return {"step_s": r["span_s"] / r["tokens"], "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME[=PATH][@JSON] or NAME=JSON")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=256, help="greedy tokens per timed run")
    ap.add_argument("--text-tokens", type=int, default=10,
                    help="prompt text tokens of the page (default 10: about 700 cached tokens; 2000: about 2,700)")
    ap.add_argument("--out", default="out/decode_b1_variants.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark times the fused batch-1 kernels: it needs a CUDA GPU")
    device, dtype, ngram = torch.device("cuda"), torch.bfloat16, 20
    variants = [parse_variant(t) for t in args.variant]
    if len({v["name"] for v in variants}) != len(variants):
        raise SystemExit("variant names must differ")
    for v in variants:
        v["cls"] = fused_class(v["path"])
    env = capture_environment(str(device))
    cal = ceilings(device)["calibrated"]
    spec = ModelSpec()
    model = synthetic_model(spec, seed=0, dtype=dtype, device=device)
    ref = Session(model, spec, load_tokenizer(None), device, "bfloat16",
                  {"source": "synthetic", "detail": "seed 0 (random weights)", "synthetic": True})
    fast = ref.with_mode("fast")
    page = page_inputs((2, 2), 1, 1, device, dtype, args.text_tokens)
    t = page.input_ids.shape[1]
    floor = decode_floor(spec, 1, list(range(t + 1, t + args.steps)), cal)["memory_floor_s"]
    times: dict[str, list[float]] = {v["name"]: [] for v in variants}
    tokens: dict[str, list[list[int]]] = {v["name"]: [] for v in variants}
    try:
        for rnd in range(args.rounds):
            for v in variants:
                r = run_variant(fast, v, page, args.steps, ngram)
                times[v["name"]].append(r["step_s"])
                tokens[v["name"]].append(r["tokens"])
                print(f"round {rnd + 1} {v['name']:<14s} {r['step_s'] * 1e3:.4f} ms/token", flush=True)
    finally:  # the engine module is shared: leave it with the checkout's kernels whatever happened
        engine_module.FusedDecode = CURRENT
    first = variants[0]["name"]
    rows = []
    for v in variants:
        name = v["name"]
        mine, theirs = tokens[name][0], tokens[first][0]
        diverge = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        rows.append({"name": name, "path": v["path"], "blocks": v["blocks"], "step_s_median": med(times[name]),
                     "step_s": times[name], "vs_floor": med(times[name]) / floor,
                     "same_tokens_every_round": all(t == mine for t in tokens[name]),
                     "first_divergence_from_first": diverge, "tokens": len(mine)})
    out = {"benchmark": "decode_b1_variants", "environment": env, "copy_tbs": cal.bandwidth_tbs,
           "memory_floor_s": floor, "prompt_tokens": t, "steps": args.steps, "rounds": args.rounds,
           "variants": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"\n{env.get('gpu_name')}: batch-1 decode, 2x2 page ({t} prompt tokens), {args.steps} tokens, median of "
          f"{args.rounds} rounds; memory floor {floor * 1e3:.4f} ms")
    print(f"{'variant':<14s} {'ms/token':>9s} {'x floor':>8s} {'same every round':>17s} "
          f"{'differs from ' + first + ' at':>24s}")
    for r in rows:
        d = r["first_divergence_from_first"]
        print(f"{r['name']:<14s} {r['step_s_median'] * 1e3:9.4f} {r['vs_floor']:8.3f} "
              f"{'yes' if r['same_tokens_every_round'] else 'NO':>17s} {'-' if d is None else d:>24}")


if __name__ == "__main__":
    main()
