"""Per-module tables: one row per torch module path (the join key for measured counts)."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..registry import stage_rank
from ..spec import Hardware
from .cost import Row
from .roofline import bound_of

_BLOCK = re.compile(r"\.(?:blocks|layers)\.(\d+)(?:\.|$)")
_AFTER = ("neck", "net_2", "net_3", "model.norm", "lm_head")  # modules that run after the blocks


def _order(path: str) -> int:
    m = _BLOCK.search(path)
    if m:
        return int(m.group(1))
    return 1 << 20 if path.endswith(_AFTER) else -1


def rows_table(rows: list[Row], hw: Hardware | None = None, point: int = 0) -> pd.DataFrame:
    """Expand rows of a sweep into one record per module path, at sweep point `point` (0 for a single workload).
    Values are per module (a row standing for 8 blocks gives each block its own record)."""
    from .predict import predictor_for

    pred = predictor_for(hw)
    records = []
    for rank, row in enumerate(rows):
        c = row.cost
        val = lambda x: float(np.asarray(x, dtype=float).reshape(-1)[point] if np.ndim(x) else x)  # noqa: E731
        rec = {
            "tensor_flops": val(c.tensor_flops), "tensor_flops_causal": val(c.tensor_flops_causal),
            "other_flops": val(c.other_flops), "weight_bytes": val(c.weight_bytes),
            "activation_read_bytes": val(c.act_read), "activation_write_bytes": val(c.act_write),
            "kv_read_bytes": val(c.kv_read), "kv_write_bytes": val(c.kv_write),
            "weight_memory": val(c.weight_memory), "peak_activation_memory": val(c.peak_activation),
            "kv_cache_memory": val(c.kv_memory),
        }
        rec["flops"] = rec["tensor_flops"] + rec["other_flops"]
        rec["activation_bytes"] = rec["activation_read_bytes"] + rec["activation_write_bytes"]
        rec["kv_bytes"] = rec["kv_read_bytes"] + rec["kv_write_bytes"]
        rec["bytes"] = rec["weight_bytes"] + rec["activation_bytes"] + rec["kv_bytes"]
        rec["intensity"] = rec["flops"] / rec["bytes"] if rec["bytes"] else 0.0  # FLOPs per byte
        if hw is not None:
            cs, ms, ts = (val(x) for x in row.times(hw.peak_flops, hw.bandwidth))
            rec.update(compute_s=cs, memory_s=ms, time_s=ts, bound=bound_of(cs, ms, ts))
        if pred is not None:  # the time model of the hardware's calibration profile, per module
            rec.update({k: val(v) for k, v in pred.row(row).items()})
        for path in row.paths:
            records.append({"stage": row.stage, "module": path, "kind": row.kind,
                            "_key": (stage_rank(row.stage), _order(path), rank), **rec})
    df = pd.DataFrame.from_records(records)
    return df.sort_values("_key", kind="stable").drop(columns="_key").reset_index(drop=True)
