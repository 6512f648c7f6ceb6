"""Closed-form, vectorised cost model of DeepSeek-OCR inference.

Rows are keyed by the torch module paths of our model (docs/model-contract.md); `tensor_flops` reproduces
`torch.utils.flop_counter.FlopCounterMode` exactly, `flops` adds the non-matmul work (`other_flops`).
One set of formulas serves a whole sweep (numpy arrays) and a single workload (a sweep of one point).
"""
from .api import (analyze, capacity_summary, decode_step_table, decode_step_totals, module_table, stage_totals,
                  tokens_summary)
from .capacity import capacity, required_hardware
from .lm import expected_experts
from .params import activated_params, param_breakdown, param_counts, stage_params, total_params
from .points import Points
from .floors import decode_floor, prefill_roofline
from .roofline import attainable_flops, bound_of, roofline_time
from .stages import METRICS, STAGES, all_rows, evaluate, flat
from .sweep import sweep_columns, sweep_table, write_sweep

__all__ = [
    "analyze", "capacity_summary", "decode_step_table", "decode_step_totals", "module_table", "stage_totals",
    "tokens_summary", "capacity", "required_hardware", "expected_experts", "activated_params", "param_breakdown",
    "param_counts", "stage_params", "total_params", "Points", "attainable_flops", "bound_of", "roofline_time",
    "decode_floor", "prefill_roofline",
    "METRICS", "STAGES", "all_rows", "evaluate", "flat", "sweep_columns", "sweep_table", "write_sweep",
]
