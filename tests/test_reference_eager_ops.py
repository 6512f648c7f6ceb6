"""The reference LM's eager elementwise ops on tables of their own (docs/accuracy.md, "The reference LM prefill's
eager ops"): casts, products against a broadcast operand and the expert loop's indexed writes run far below the
vectorised add the remainder of a row is priced on, so the reference plan lists them as kernels; a profile measured
before their tables prices them on the elementwise table, and says so."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.kernels import BROADCAST, CAST, GATHER, INDEX_PUT, Call
from dsocr_core.analytic.predict import with_profile
from dsocr_core.analytic.stages import prefill_rows
from dsocr_core.calibration.ops import kernel_op
from dsocr_core.calibration.profile import profile_from_dict, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.runtime.reference_plan import ReferenceOptions, ReferencePlan
from dsocr_core.spec import ModelSpec

H200 = get_hardware("h200-sxm")
PLAN = ReferencePlan(ReferenceOptions(), "cuda")
EAGER_TABLES = {CAST, BROADCAST, INDEX_PUT, GATHER}


@pytest.mark.parametrize("nbytes", [1 << 16, 1 << 20, 1 << 24, 1 << 28])
def test_the_broadcast_entry_times_a_product_with_a_broadcast_row_at_its_bytes(nbytes):
    make, op, input_set, kernels = kernel_op("memory.broadcast", {"bytes": nbytes}, "cpu", 64)
    x, w = make()
    assert w.dim() == 1 and w.shape[0] == x.shape[1] == 1280  # the norm's weight against every row
    out = op((x, w))
    assert torch.equal(out, x * w) and kernels == 1
    moved = 2 * x.numel() * 2  # bf16: read x, write the product
    assert input_set == moved and (abs(moved / nbytes - 1) < 0.1 if nbytes >= 1 << 20 else moved <= 4 * nbytes)


@pytest.mark.parametrize("nbytes", [1 << 16, 1 << 20, 1 << 24])
def test_the_index_put_entry_writes_every_row_once_through_a_permutation(nbytes):
    make, op, input_set, kernels = kernel_op("memory.index_put", {"bytes": nbytes}, "cpu", 64)
    out, src = make()
    op((out, src))
    # every source row landed in exactly one place: the rows of the result are the source's, reordered
    assert torch.equal(out.float().sum(0), src.float().sum(0)) or torch.allclose(out.float().sum(0),
                                                                                 src.float().sum(0), atol=1e-2)
    assert sorted(map(tuple, out.tolist())) == sorted(map(tuple, src.tolist()))
    moved = 2 * src.numel() * 2  # read the rows, write them
    assert kernels == 1 and input_set == moved
    assert abs(moved / nbytes - 1) < 0.1 if nbytes >= 1 << 20 else moved <= 4 * nbytes


def _prefill_rows(batch=26, text=1814, mode="large"):
    pts = Points.build(mode=mode, text_tokens=text, batch=batch, decode_steps=0, logits="last")
    return {r.kind: r for r in prefill_rows(ModelSpec(), pts)}


def _plan(row):
    return PLAN.plan(Call(row.kind, row.cost, row.ctx[0]))


@pytest.mark.parametrize("kind,tables,launches", [
    ("lm.input_layernorm", [CAST, CAST, BROADCAST], 8.0),  # float, pow, mean, + eps, rsqrt, *, to, * weight
    ("lm.norm", [CAST, CAST, BROADCAST], 8.0),
    ("lm.self_attn", ["gemm", "attention.sdpa.causal", "memory.copy", BROADCAST], 4 + 1 + 0 + 10 + 1),
    ("lm.mlp.gate", ["gemm.float32", CAST], 6.0),
])
def test_the_eager_ops_are_kernels_of_their_own_and_the_launches_stay_the_models(kind, tables, launches):
    row = _prefill_rows()[kind]
    plan = _plan(row)
    assert [k.table for k in plan.kernels] == tables
    assert float(sum(np.sum(k.launches) for k in plan.kernels) + np.sum(plan.rest_launches)) == launches
    # the kernels take shares of the row's counted bytes, and the remainder keeps what is left of them
    share = sum(np.sum(k.nbytes) for k in plan.kernels)
    assert 0 < share <= float(np.sum(row.cost.bytes)) * (1 + 1e-9)


def test_the_expert_loop_gathers_and_writes_each_touched_experts_rows_once():
    row = _prefill_rows()["lm.mlp.experts"]
    plan = _plan(row)
    by_table = {}
    for k in plan.kernels:
        by_table.setdefault(k.table, []).append(k)
    t = 26 * float(np.ravel(row.ctx[0]["sq"])[0])
    rows = t * ModelSpec().num_experts_per_tok * ModelSpec().hidden_size  # (token, slot) elements
    (gather,), (put,) = by_table[GATHER], by_table[INDEX_PUT]
    experts = float(np.sum(gather.launches))
    assert experts == float(np.sum(put.launches)) == 64  # every expert gets tokens at 58,000 tokens (uniform)
    assert float(np.sum(gather.nbytes)) == float(np.sum(put.nbytes)) == pytest.approx(2 * rows * 2)
    assert float(np.ravel(put.coords["bytes"])[0]) == pytest.approx(2 * rows * 2 / 64)  # one expert's rows a launch
    assert len(by_table[CAST]) == 2  # .float() of the slot rows, and their float32 product with the weights
    # 3 GEMMs, the gather and index_put_, SiLU and the product per expert; argsort, bincount, // k; float, * weights,
    # sum, the cast back, the residual add: the launches the model dispatches
    total = sum(float(np.sum(k.launches)) for k in plan.kernels) + float(np.sum(plan.rest_launches))
    assert total == 3 + 7 * 64 + 5


def _profile(eager_efficiency: float | None):
    """Every table at 0.9; memory.broadcast and memory.index_put at `eager_efficiency`, or absent (None: a profile
    measured before them)."""
    d = uniform_profile(H200.peak_flops, H200.bandwidth, 0.9, 0.0, kind="cuda").to_dict()
    for name in ("memory.broadcast", "memory.index_put"):
        if eager_efficiency is None:
            d["tables"].pop(name)
        else:
            d["tables"][name] = dict(d["tables"][name], efficiency=[eager_efficiency] * len(
                d["tables"][name]["efficiency"]))
    return profile_from_dict(d)


def test_the_reference_prefill_is_priced_on_the_eager_tables_and_a_profile_without_them_says_so():
    pts = Points.build(mode="large", text_tokens=1814, batch=26, decode_steps=0, logits="last")
    older = _profile(None)
    hw_old = with_profile(H200, older, EngineSpec.of("reference"))
    before = float(evaluate(ModelSpec(), pts, hw_old)["prefill"]["predicted_s"][0])
    assert any("memory.broadcast" in n and "memory.elementwise" in n for n in hw_old.prediction.notes)
    slow = _profile(0.18)
    hw_slow = with_profile(H200, slow, EngineSpec.of("reference"))
    after = float(evaluate(ModelSpec(), pts, hw_slow)["prefill"]["predicted_s"][0])
    assert after > 1.1 * before  # the norms', RoPE's and the expert loop's ops at a fifth of the bandwidth
    # the fast engine runs none of these ops: its prediction does not move
    fast_old = with_profile(H200, older, EngineSpec.of("fast"))
    fast_new = with_profile(H200, slow, EngineSpec.of("fast"))
    assert float(evaluate(ModelSpec(), pts, fast_old)["prefill"]["predicted_s"][0]) == pytest.approx(
        float(evaluate(ModelSpec(), pts, fast_new)["prefill"]["predicted_s"][0]), rel=1e-12)


def test_the_expert_loop_host_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/reference_moe_host.py as a smoke test: the tiny model's loop at two sizes, every figure written."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reference_moe_host.py"
    spec = importlib.util.spec_from_file_location("reference_moe_host", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "mh.json"
    assert bench.main(["--device", "cpu", "--preset", "tiny", "--tokens", "16,64", "--out", str(out)]) == 0
    import json

    d = json.loads(out.read_text())
    assert [r["tokens"] for r in d["rows"]] == [16, 64] and d["environment"]["device"] == "cpu"
    for r in d["rows"]:
        assert 0 < r["touched"] <= 64 and r["host_s"] > 0 and r["wall_s"] >= r["host_s"] * 0.5
        assert r["device_busy_s"] is None and r["probe_op_s"] is None  # no CUDA: no kernels, no probe
    skewed = tmp_path / "mh_skewed.json"  # --zipf: uneven loads, as the synthetic weights' recorded ones
    assert bench.main(["--device", "cpu", "--preset", "tiny", "--tokens", "64", "--zipf", "1.5", "--out",
                       str(skewed)]) == 0
    (uneven,) = json.loads(skewed.read_text())["rows"]
    (even,) = [r for r in d["rows"] if r["tokens"] == 64]
    assert uneven["zipf"] == 1.5 and even["zipf"] == 0.0 and uneven["largest_share"] > 1.3 * even["largest_share"]
    with pytest.raises(SystemExit, match="whole numbers"):
        bench.main(["--device", "cpu", "--preset", "tiny", "--tokens", "16,x", "--out", str(out)])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_kernels_shares_stay_within_every_lm_rows_counted_bytes(dtype, attn):
    """Prefill and decode (its first and last step), both dtypes, both attentions, a small and a large batch: the
    explicit kernels never take more than the row's counted bytes, so nothing of the remainder is clipped."""
    from dsocr_core.analytic.stages import decode_rows

    for batch, text in ((1, 10), (26, 1814)):
        pts = Points.build(mode="large", text_tokens=text, batch=batch, decode_steps=16, logits="last", dtype=dtype,
                           attn=attn)
        calls = [(r, r.cost, r.ctx[0]) for r in prefill_rows(ModelSpec(), pts) if r.kind.startswith("lm.")]
        for r in decode_rows(ModelSpec(), pts):
            if r.kind.startswith("lm.") and r.steps:
                first, last, _ = r.steps
                calls += [(r, first, dict(r.ctx[0], n=r.ctx[0]["n"])), (r, last, r.ctx[-1])]
        for row, cost, ctx in calls:
            plan = PLAN.plan(Call(row.kind, cost, ctx))
            share = sum(float(np.sum(k.nbytes)) for k in plan.kernels)
            assert share <= float(np.sum(cost.bytes)) * (1 + 1e-9), (row.kind, ctx.get("phase"), dtype, attn, batch)
