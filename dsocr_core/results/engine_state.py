"""A measured point's engine state (Engine.point_state, stored in the point's extra) as one line for tables.
Torch-free: the pages that show stored runs do not load torch."""
from __future__ import annotations


def state_text(state: dict | None) -> str | None:
    """One line of a point's engine state (Engine.point_state) for tables, e.g. 'fast: compiled
    automatic-dynamic/static (sam_block 14, clip_layer 6, lm_layer 6, lm_last_layer 6 variants), graphs: decode
    1/1, prefill graph, cache 2,048 (bucket 256), fused decode'. None without a state."""
    if not state:
        return None
    if state.get("engine") != "fast":
        return f"{state.get('engine')}: eager, nothing kept between runs"
    compiled = state.get("compiled_prefill")
    if isinstance(compiled, dict) and compiled:
        policies = sorted({v["shapes"] for v in compiled.values()})
        variants = ", ".join(f"{n} {v['variants']}" for n, v in compiled.items())
        parts = [f"compiled {'/'.join(policies)} ({variants} variants)"]
    else:
        parts = ["prefill eager"]
    if not state.get("graphs_enabled"):
        parts.append("graphs off")
    elif "decode_graphs" in state:
        decode = state["decode_graphs"].values()
        prefill = sorted(set(state.get("prefill_graphs", {}).values()))
        parts.append(f"graphs: decode {sum(v == 'graph' for v in decode)}/{len(decode)}, prefill "
                     f"{'/'.join(prefill) or 'none'}")
    if "capacity" in state:
        parts.append(f"cache {state['capacity']:,} (bucket {state['bucket']}), {state['decode_path']} decode")
    return "fast: " + ", ".join(parts)
