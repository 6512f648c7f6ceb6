"""Hardware floors of the two phases a serving engine is judged by, from the analytic model: the bytes one decode
step must move (the weights it touches and the KV cache it reads and writes), and the prefill's roofline."""
from __future__ import annotations

from ..spec import Hardware, ModelSpec, Workload
from .api import decode_step_totals, stage_totals
from .lm import expected_experts


def decode_floor(spec: ModelSpec, batch: int, contexts: list[int], hw: Hardware, touched: float | None = None,
                 weight_bytes_per_param: int = 2) -> dict:
    """Mean over the given contexts of one decode step's bytes that must move (touched weights + KV cache read
    and written) and FLOPs; memory floor = bytes / bandwidth; roofline = max(memory floor, FLOPs / peak).
    `touched`: measured distinct routed experts per MoE layer, replacing the analytic uniform-routing estimate."""
    w = Workload(mode="gundam", crops=(2, 2), batch=batch, logits="last")
    byts, flops = [], []
    one_expert = 3 * spec.hidden_size * spec.moe_intermediate_size * weight_bytes_per_param
    expected = float(expected_experts(spec.n_routed_experts, spec.num_experts_per_tok, batch))
    for c in (contexts[0], contexts[-1]):  # every count is affine in the context: mean = mean of the ends
        d = decode_step_totals(spec, w, c, hw)
        weights = d["weight_bytes"]
        if touched is not None:
            weights += len(spec.moe_layers) * (touched - expected) * one_expert
        byts.append(weights + d["kv_read_bytes"] + d["kv_write_bytes"])
        flops.append(d["flops"])
    b, f = sum(byts) / 2, sum(flops) / 2
    mem, comp = b / hw.bandwidth, f / hw.peak_flops
    return {"bytes": b, "flops": f, "memory_floor_s": mem, "compute_floor_s": comp, "roofline_s": max(mem, comp),
            "expected_experts": expected, "touched_experts": touched}


def prefill_roofline(spec: ModelSpec, grid: tuple[int, int], hw: Hardware, logits: str, text_tokens: int = 10) -> dict:
    """Vision + LM prefill of one Gundam page: its FLOPs and bytes, the roofline of the analytic bytes (every
    eager op's traffic), the compute floor (FLOPs, or only the weights and KV that must move) and the sum of the
    per-row rooflines."""
    st = stage_totals(spec, Workload(mode="gundam", crops=grid, text_tokens=text_tokens, logits=logits), hw)
    flops = st["vision"]["flops"] + st["prefill"]["flops"]
    byts = st["vision"]["bytes"] + st["prefill"]["bytes"]
    min_bytes = st["vision"]["weight_bytes"] + st["prefill"]["weight_bytes"] + st["prefill"]["kv_bytes"]
    return {"flops": flops, "bytes": byts, "min_bytes": min_bytes,
            "roofline_s": max(flops / hw.peak_flops, byts / hw.bandwidth),
            "compute_floor_s": max(flops / hw.peak_flops, min_bytes / hw.bandwidth),
            "per_row_s": st["vision"]["time_s"] + st["prefill"]["time_s"]}
