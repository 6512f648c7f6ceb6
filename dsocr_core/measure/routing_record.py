"""Which routed experts each MoE layer touches: recorded, cheaply, in the FLOP-counting pass of a measured point.

Every measured point (sweeps and dataset pages, either engine) already runs the reference model once more over
the same inputs to count FLOPs (stage_stats.counted_flops: the prefill and two greedy decode steps, the tokens the
timed greedy run produces). A forward hook on each MoE gate records there, per layer and call, the tokens routed
and how many distinct experts they reached; nothing is added to the timed runs. The records are stored with the
point (the `routing` entry of the prefill and decode_step stage results) and read back as a Routing
(analytic/routing.py) to predict the run with the routing it observed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

from ..model.decoder import MoEGate

SOURCE = "FLOP-counting pass (the reference model, the point's inputs)"


class GateCall(NamedTuple):
    """One MoE gate call: the tokens routed, how many distinct experts they reached, the rows each touched expert
    got (largest first: a grouped GEMM's time follows them, not only their count; fast/plan.py prices each group
    in whole tiles) and the rows of every expert by id (what merges calls over parts of a batch)."""

    tokens: int
    distinct: int
    loads: list[int]
    by_expert: tuple[int, ...]


def gate_call(tokens: int, by_expert) -> GateCall:
    """The call of `tokens` tokens whose experts got `by_expert` rows each (by id)."""
    loads = sorted((int(c) for c in by_expert if c), reverse=True)
    return GateCall(int(tokens), len(loads), loads, tuple(int(c) for c in by_expert))


@contextmanager
def record_routing(model: torch.nn.Module):
    """Yields a list that receives a GateCall for every MoE gate call, in call order."""
    calls: list[GateCall] = []

    def hook(module, _inputs, output):
        ids = output[1]  # [tokens, k] expert ids
        counts = torch.bincount(ids.reshape(-1), minlength=module.weight.shape[0])
        calls.append(gate_call(ids.shape[0], counts.tolist()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MoEGate)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def merge_parts(parts: list[list[GateCall]]) -> list[GateCall]:
    """The calls of one pass over a whole batch, from passes over its parts (the same forwards over other rows):
    each call's tokens and each expert's rows summed over the parts. Rows route independently of each other, so
    this is what the whole batch routes (up to rounding where a part's kernels round differently)."""
    if len({len(p) for p in parts}) > 1:
        raise ValueError(f"the parts made different numbers of gate calls: {[len(p) for p in parts]}")
    merged = []
    for calls in zip(*parts):
        by_expert = [sum(c) for c in zip(*(call.by_expert for call in calls))]
        merged.append(gate_call(sum(call.tokens for call in calls), by_expert))
    return merged


def routing_records(calls: list[GateCall], moe_layers: int, parts: int = 1) -> dict[str, dict] | None:
    """The calls of one prefill and the decode steps after it, as the stored records: {"prefill": {"tokens",
    "distinct": [per layer], "loads": [[rows per touched expert, largest first] per layer]}, "decode": {"tokens",
    "distinct": [[per layer] per step], "loads": [[[...] per layer] per step]}}, each with its "source" (saying
    in how many parts of the batch it was recorded, when more than one); None without MoE layers or when the
    calls are not whole forwards (a model with other gates)."""
    if not moe_layers or not calls or len(calls) % moe_layers:
        return None
    forwards = [calls[i:i + moe_layers] for i in range(0, len(calls), moe_layers)]
    prefill, steps = forwards[0], forwards[1:]
    source = SOURCE if parts == 1 else f"{SOURCE}, in {parts} parts of the batch, each expert's rows summed"
    out = {"prefill": {"tokens": prefill[0].tokens, "distinct": [c.distinct for c in prefill],
                       "loads": [c.loads for c in prefill], "source": source}}
    if steps:
        out["decode"] = {"tokens": steps[0][0].tokens, "distinct": [[c.distinct for c in s] for s in steps],
                         "loads": [[c.loads for c in s] for s in steps], "source": source}
    return out
