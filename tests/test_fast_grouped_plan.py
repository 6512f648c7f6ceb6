"""The prefill's grouped expert GEMMs in the fast plan (fast/plan.py, docs/fast-mode.md "The grouped GEMMs'
steps"): a group of more than half a tile pays for whole tiles of GROUPED_TILE_ROWS rows where the groups are even
(the shared experts, uniform routing); under an observed routing only the mean rows per expert is known, and it
is priced at that mean."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points
from dsocr_core.analytic.kernels import Call
from dsocr_core.analytic.routing import routing_from_calls
from dsocr_core.analytic.stages import prefill_rows
from dsocr_core.engines import EngineSpec
from dsocr_core.fast.plan import GROUPED_TILE_ROWS, tiled_rows
from dsocr_core.spec import ModelSpec, Workload

SPEC = ModelSpec()
PLAN = EngineSpec.of("fast").kernel_plan("cuda")


def test_rows_round_up_to_whole_tiles_above_half_a_tile():
    assert GROUPED_TILE_ROWS == 256
    got = tiled_rows(np.array([1.0, 100.0, 128.0, 129.0, 256.0, 257.0, 290.0, 512.0, 1320.0]))
    assert got.tolist() == [1.0, 100.0, 128.0, 256.0, 256.0, 512.0, 512.0, 512.0, 1536.0]


def _grouped_kernels(kind: str, routing=None, batch: int = 8):
    pts = Points.from_workload(Workload(mode="base", text_tokens=300, batch=batch))
    (row,) = [r for r in prefill_rows(SPEC, pts) if r.kind == kind]
    plan = PLAN.plan(Call(row.kind, row.cost, row.ctx[0], routing=routing))
    return [k for k in plan.kernels if k.table == "grouped_gemm"], float(np.sum(row.ctx[0]["b"] * row.ctx[0]["sq"]))


def test_the_shared_experts_pay_for_whole_tiles_of_every_token():
    kernels, tokens = _grouped_kernels("lm.mlp.shared_experts")
    assert len(kernels) == 2 and tokens > GROUPED_TILE_ROWS
    padded = float(tiled_rows(tokens))
    for k in kernels:
        assert float(np.sum(k.coords["tokens"])) == pytest.approx(padded)
        assert float(np.sum(k.real_flops)) == pytest.approx(float(np.sum(k.flops)) * padded / tokens)


def test_uniform_routing_pads_the_mean_group_and_an_observed_routing_does_not():
    uniform, tokens = _grouped_kernels("lm.mlp.experts")
    slots = tokens * SPEC.num_experts_per_tok
    for k in uniform:
        rows = float(np.sum(k.coords["tokens"]))
        assert rows % GROUPED_TILE_ROWS == 0 and rows >= slots / SPEC.n_routed_experts
    observed = routing_from_calls([(tokens, 40.0)], SPEC.n_routed_experts, SPEC.num_experts_per_tok, "test")
    seen, _ = _grouped_kernels("lm.mlp.experts", routing=observed)
    for k in seen:
        assert float(np.sum(k.coords["tokens"])) == pytest.approx(slots / 40.0)
        assert float(np.sum(k.real_flops)) == pytest.approx(float(np.sum(k.flops)))


def test_an_observed_routing_with_loads_prices_each_rank_bucket_at_its_own_tiles():
    """One expert with 70% of the rows and the rest spread thin: the largest group pays for its own whole tiles,
    the thin ones for what they hold; the buckets' analytic shares add up to the GEMM's, one launch each GEMM."""
    even, tokens = _grouped_kernels("lm.mlp.experts")
    slots = tokens * SPEC.num_experts_per_tok
    rest = [0.3 / 63] * 63
    calls = [(tokens, 64.0, [0.7 * slots] + [r * slots for r in rest])]
    routing = routing_from_calls(calls, SPEC.n_routed_experts, SPEC.num_experts_per_tok, "test")
    ranked, _ = _grouped_kernels("lm.mlp.experts", routing=routing)
    assert len(ranked) == 8 and sum(float(np.sum(k.launches)) for k in ranked) == 2.0
    for share in (sum(float(np.sum(k.flops)) for k in ranked[:4]), sum(float(np.sum(k.flops)) for k in ranked[4:])):
        assert share in (pytest.approx(float(np.sum(even[0].flops))), pytest.approx(float(np.sum(even[1].flops))))
    top = ranked[0]
    assert float(np.sum(top.coords["tokens"])) == pytest.approx(float(tiled_rows(0.7 * slots)))
    thin = ranked[3]  # ranks 17-64: each holds about 0.3 / 63 of the rows
    held = 0.3 / 63 * slots
    assert float(np.sum(thin.coords["tokens"])) == pytest.approx(float(tiled_rows(held)))


def test_the_moe_row_kernels_are_priced_by_the_bytes_each_moves():
    """moe_rows='triton' (the default on a GPU): the grouping's two passes, the copy into expert order, SwiGLU and
    the weighted combine are kernels of their own by their bytes, the routing's 12 small kernels the remainder;
    moe_rows='torch' keeps Inductor's 17-launch remainder and no such kernels."""
    pts = Points.from_workload(Workload(mode="base", text_tokens=300, batch=8))
    (row,) = [r for r in prefill_rows(SPEC, pts) if r.kind == "lm.mlp.experts"]
    tokens = float(np.sum(row.ctx[0]["b"] * row.ctx[0]["sq"]))
    slots = SPEC.num_experts_per_tok + SPEC.n_shared_experts
    rows, h, im = tokens * slots, SPEC.hidden_size, SPEC.moe_intermediate_size
    triton = EngineSpec.of("fast", {"moe_rows": "triton"}).kernel_plan("cuda").plan(Call(row.kind, row.cost, row.ctx[0]))
    glue = [k for k in triton.kernels if k.table != "grouped_gemm"]
    assert [k.table for k in glue] == ["memory.group_rows", "memory.gather_rows", "memory.elementwise",
                                       "memory.gather_rows"]
    onehot = rows * 128 * 4  # a pass: 66 experts (64 routed, 2 shared) in 128 lanes, int32
    want = [2 * onehot, tokens * h * 2 * (1 + slots), rows * 3 * im * 2, tokens * h * 2 * (slots + 2) + rows * 12]
    assert [float(np.sum(k.real_bytes)) for k in glue] == pytest.approx(want)
    assert all(float(np.sum(k.nbytes)) == 0.0 for k in glue)  # the row's analytic share stays with the remainder
    assert sum(float(k.launches) for k in glue) == 7.0 and float(triton.rest_launches) == 12.0
    torch_rows = EngineSpec.of("fast", {"moe_rows": "torch"}).kernel_plan("cuda").plan(
        Call(row.kind, row.cost, row.ctx[0]))
    assert [k.table for k in torch_rows.kernels] == ["grouped_gemm"] * 2
    assert float(torch_rows.rest_launches) == 17.0 and torch_rows.rest_real_bytes is None
    assert EngineSpec.of("fast").kernel_plan("cuda").o.moe_rows == "triton"
    assert EngineSpec.of("fast").kernel_plan("cpu").o.moe_rows == "torch"


def test_the_grouping_table_is_measured_in_the_plans_units():
    """memory.group_rows: the calibration times moe_rows.group_rows at the one-hot work per (token, slot) row the
    plan prices the grouping by, on a GPU only; its grid reaches the largest prefill calls measured so far."""
    from dsocr_core.calibration.microbench import grids
    from dsocr_core.calibration.ops import GROUP_BYTES_PER_ROW, GROUP_EXPERTS, GROUP_SLOTS, kernel_count
    from dsocr_core.fast.options import expert_lanes

    assert GROUP_EXPERTS == SPEC.n_routed_experts + SPEC.n_shared_experts
    assert GROUP_SLOTS == SPEC.num_experts_per_tok + SPEC.n_shared_experts
    assert expert_lanes(GROUP_EXPERTS) == 128 and GROUP_BYTES_PER_ROW == 2 * 128 * 4
    assert kernel_count("memory.group_rows") == 4
    assert "memory.group_rows" not in grids(False, "cpu")
    axis = grids(False, "cuda")["memory.group_rows"]["bytes"]
    assert axis[-1] / (GROUP_BYTES_PER_ROW * GROUP_SLOTS) >= 54_000  # tokens of the largest held-out call
