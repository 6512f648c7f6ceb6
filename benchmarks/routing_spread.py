"""How many distinct routed experts does one decode step touch, against what the analytic model assumes?

The analytic model (analytic/lm.py `expected_experts`) and the time model take each token to pick its k experts
uniformly and independently: E x (1 - (1 - k/E)^B) distinct experts per MoE layer for B tokens. That sets the
weight bytes a batched decode step reads (and, in the reference mode, how many times its Python expert loop
runs). This benchmark records the router's choices (measure/routing_record.py: a forward hook on every MoE gate
of the reference model) during greedy decoding of a batch of distinct synthetic pages, and prints per batch size
the measured mean distinct experts per layer and step beside the uniform expectation. Run it with your checkpoint
to see whether its routing matches the assumption; with synthetic (random) weights it shows how far they are from
it. `--routing-out FILE` writes the figures as a routing profile (analytic/routing.py) for what-if predictions
(the sidebar's MoE routing, `analytic --routing FILE`); `--from-json` converts an earlier `--json` result.

    python benchmarks/routing_spread.py --synthetic full --batches 1,4,16,64       # a GPU
    python benchmarks/routing_spread.py --synthetic tiny --device cpu --batches 1,4  # seconds, anywhere
    python benchmarks/routing_spread.py --from-json docs/results/h200_routing_spread.json \
        --routing-out data/routing/h200_synthetic_decode.json                       # no model
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def routing_of(result: dict, origin: str):
    """The decode routing of a result (its rows: batch = tokens per call) as a routing profile; `origin`: where
    it was measured (the device, or the result file it was read from)."""
    from dsocr_core.analytic.routing import Routing

    rows = sorted(result["rows"], key=lambda r: r["batch"])
    weights = result["weights"]
    source = f"routing_spread.py, {origin}: {weights.get('source')} weights ({weights.get('detail')}), decode steps"
    return Routing(int(result["experts"]), int(result["k"]), tuple(float(r["batch"]) for r in rows),
                   tuple(float(r["measured_distinct_experts"]) for r in rows), tuple(int(r["samples"]) for r in rows),
                   source)


def measure(args) -> dict:
    import torch

    from dsocr_core.analytic.lm import expected_experts
    from dsocr_core.measure.routing_record import record_routing
    from dsocr_core.runtime.generate import Greedy
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    session = Session.load(checkpoint=args.checkpoint, synthetic=None if args.checkpoint else args.synthetic,
                           device=args.device, dtype=args.dtype, session_mode="reference")
    spec = session.spec
    rows = []
    for b in [int(x) for x in args.batches.split(",") if x.strip()]:
        inputs = synthetic_inputs(args.mode, (1, 1), 10, b, seed=1).to(session.device, session.torch_dtype)
        gen = Greedy(session.engine, inputs, max_new_tokens=args.steps + 1, no_repeat_ngram_size=0,
                     stop_at_eos=False, memory="none")
        prefill_calls = None
        with record_routing(session.model) as calls, torch.inference_mode():
            for _ in gen:  # the first yield is the prefill's token: every later gate call is a decode step's
                prefill_calls = len(calls) if prefill_calls is None else prefill_calls
        seen = [c.distinct for c in calls[prefill_calls or 0:]]
        measured = float(np.mean(seen)) if seen else float("nan")
        uniform = float(expected_experts(spec.n_routed_experts, spec.num_experts_per_tok, b))
        rows.append({"batch": b, "measured_distinct_experts": measured, "uniform_expectation": uniform,
                     "ratio": measured / uniform, "samples": len(seen)})
        print(f"batch {b:3d}: {measured:6.2f} distinct experts per layer and step (uniform routing: "
              f"{uniform:6.2f}; ratio {measured / uniform:.2f}; {len(seen)} layer-steps)", flush=True)
    return {"weights": dict(session.weights), "device": str(session.device), "experts": spec.n_routed_experts,
            "k": spec.num_experts_per_tok, "steps": args.steps, "rows": rows}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", default="full", help="tiny | full (random weights), unless --checkpoint")
    ap.add_argument("--checkpoint", help="a local checkpoint folder")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--mode", default="base", help="page mode of the synthetic inputs (default base)")
    ap.add_argument("--steps", type=int, default=16, help="decode steps recorded per batch")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--routing-out", type=Path, help="also write them as a routing profile here")
    ap.add_argument("--from-json", type=Path, help="measure nothing: read an earlier --json result")
    args = ap.parse_args(argv)

    out = json.loads(args.from_json.read_text()) if args.from_json else measure(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
    if args.routing_out:
        origin = args.from_json.name if args.from_json else out["device"]
        print(f"routing profile: {routing_of(out, origin).save(args.routing_out)}", flush=True)
    print(json.dumps(out, default=str))
    return out


if __name__ == "__main__":
    main()
