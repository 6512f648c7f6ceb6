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

import torch

from ..model.decoder import MoEGate

SOURCE = "FLOP-counting pass (the reference model, the point's inputs)"


@contextmanager
def record_routing(model: torch.nn.Module):
    """Yields a list that receives (tokens, distinct experts, loads) for every MoE gate call, in call order;
    loads: the rows each touched expert got, largest first (a grouped GEMM's time follows them, not only their
    count: fast/plan.py prices each group in whole tiles)."""
    calls: list[tuple[int, int, list[int]]] = []

    def hook(_module, _inputs, output):
        ids = output[1]  # [tokens, k] expert ids
        counts = torch.bincount(ids.reshape(-1))
        loads = sorted((int(c) for c in counts.tolist() if c), reverse=True)
        calls.append((int(ids.shape[0]), len(loads), loads))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, MoEGate)]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def routing_records(calls: list[tuple[int, int, list[int]]], moe_layers: int) -> dict[str, dict] | None:
    """The calls of one prefill and the decode steps after it, as the stored records: {"prefill": {"tokens",
    "distinct": [per layer], "loads": [[rows per touched expert, largest first] per layer]}, "decode": {"tokens",
    "distinct": [[per layer] per step], "loads": [[[...] per layer] per step]}}; None without MoE layers
    or when the calls are not whole forwards (a model with other gates)."""
    if not moe_layers or not calls or len(calls) % moe_layers:
        return None
    forwards = [calls[i:i + moe_layers] for i in range(0, len(calls), moe_layers)]
    prefill, steps = forwards[0], forwards[1:]
    out = {"prefill": {"tokens": prefill[0][0], "distinct": [c[1] for c in prefill],
                       "loads": [c[2] for c in prefill], "source": SOURCE}}
    if steps:
        out["decode"] = {"tokens": steps[0][0][0], "distinct": [[c[1] for c in s] for s in steps],
                         "loads": [[c[2] for c in s] for s in steps], "source": SOURCE}
    return out
