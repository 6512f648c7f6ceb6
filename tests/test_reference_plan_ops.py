"""The reference engine's kernel plan (runtime/reference_plan.py) against what the model really dispatches.

A tiny synthetic model runs through the ReferenceEngine on the CPU (a prefill with its vision stages, one greedy
decode step) under runtime/op_count.py's dispatch counter. Per stage and per group of rows, the kernel-launching
aten ops counted must equal the plan's launches (its kernels' launches + rest_launches) for the same rows, and the
host syncs its syncs, exactly: an op added to the model without the plan following fails here.

Groups, not single rows: a block's own code (SAM's window partition, the residual adds, the MoE's expert loop)
runs outside the modules the rows name, and the plan files those ops under one of the block's rows.

Not compared: allocations, and metadata-only ops (views) outside the projector stage, which launch nothing (the plan
prices views, as view_ops at the profile's host cost of a view, where the host cost per op of the model's own code
does not fold them in: the expert loop's Python slices, and the projector stage, whose views are compared exactly). The CPU run is exact; on CUDA, SDPA
may add ops inside its own decomposition (the efficient kernel pads a dense mask whose last dimension is not a
multiple of 16: SAM's 14x14 windows) and bincount synchronises internally: neither is visible here.
"""
import pytest
import torch

from dsocr_core.model import synthetic_model
from dsocr_core.runtime.op_count import compare_workload
from dsocr_core.runtime.reference_plan import ReferenceOptions, ReferencePlan
from dsocr_core.spec import tiny_spec

PLAN = ReferencePlan(ReferenceOptions(), "cuda")


@pytest.fixture(scope="module")
def models():
    return {impl: synthetic_model(tiny_spec(), seed=0, dtype="bfloat16", attn_impl=impl)
            for impl in ("sdpa", "eager")}


def _mismatches(comparisons) -> list[str]:
    out = []
    for c in comparisons:
        if c.planned.launches != c.launch or c.planned.syncs != c.syncs:
            out.append(f"{c.stage}/{c.group}: plan {c.planned.launches:g} launches, {c.planned.syncs:g} syncs; "
                       f"model {c.launch} launches {dict(c.names)}, {c.syncs} syncs")
    return out


# gundam 2x1: a 1024 global view (windows padded, global rel-pos at the learned size) and 640 tiles (rel-pos and
# positions resized), newlines with tiles; tiny (512) at batch 2: two image rows, no tiles; eager LM attention
@pytest.mark.parametrize("impl,mode,grid,batch", [("sdpa", "gundam", (2, 1), 1), ("eager", "tiny", (1, 1), 2)])
def test_plan_launches_equal_dispatched_ops(models, impl, mode, grid, batch):
    with torch.no_grad():
        comparisons = compare_workload(models[impl], PLAN, mode, grid, batch)
    stages = {c.stage for c in comparisons}
    assert {"sam", "clip", "projector", "prefill", "decode"} <= stages
    assert not _mismatches(comparisons), "\n".join(_mismatches(comparisons))


def test_counter_sees_an_added_op(models, monkeypatch):
    """The comparison is not vacuous: one more elementwise op in a CLIP MLP shows up as a mismatch."""
    from dsocr_core.model.clip import ClipMLP

    plain = ClipMLP.forward
    monkeypatch.setattr(ClipMLP, "forward", lambda self, x: plain(self, x) * 1.0)
    with torch.no_grad():
        comparisons = compare_workload(models["sdpa"], PLAN, "tiny")
    assert [m.split(":")[0] for m in _mismatches(comparisons)] == ["clip/clip.layer"]


@pytest.mark.parametrize("impl,mode,grid,batch", [("sdpa", "gundam", (2, 1), 1), ("eager", "tiny", (1, 1), 2)])
def test_a_float32_models_casts_launch_nothing_and_the_plan_counts_none(impl, mode, grid, batch):
    """In a float32 model .float() and .to(dt) return the tensor itself (the norms, the router, the expert loop's
    combine, eager attention's scores, the resized position tables): the plan launches none of them there."""
    model = synthetic_model(tiny_spec(), seed=0, dtype="float32", attn_impl=impl)
    with torch.no_grad():
        comparisons = compare_workload(model, PLAN, mode, grid, batch)
    assert not _mismatches(comparisons), "\n".join(_mismatches(comparisons))


@pytest.mark.parametrize("grid,batch", [((2, 1), 1), ((1, 1), 3), ((1, 1), 1), ((3, 2), 2)])
def test_deepseek_ocr2_plan_launches_equal_dispatched_ops(grid, batch):
    """DeepSeek-OCR 2's reference run (SAM, the query encoder, the projector with its one cat per image, the LM):
    every group's launches and syncs as the model dispatches them. The encoder is one group (op_count.group_of):
    its per-call setup (the mask, the RoPE tables, the query concatenation) runs outside the rows' modules, and the
    plan files it under the queries' rows."""
    from dsocr_core.registry import FAMILIES

    model = synthetic_model(FAMILIES["deepseek-ocr2"].preset("tiny"), seed=0, dtype="bfloat16")
    with torch.no_grad():
        comparisons = compare_workload(model, PLAN, "dynamic", grid, batch)
    assert {"sam", "encoder", "projector", "prefill", "decode"} <= {c.stage for c in comparisons}
    assert not _mismatches(comparisons), "\n".join(_mismatches(comparisons))


@pytest.mark.parametrize("family,mode,grid,batch", [
    ("deepseek-ocr", "gundam", (2, 1), 1), ("deepseek-ocr", "tiny", (1, 1), 3), ("deepseek-ocr", "gundam", (3, 2), 2),
    ("deepseek-ocr2", "dynamic", (1, 1), 1), ("deepseek-ocr2", "dynamic", (1, 1), 3),
    ("deepseek-ocr2", "dynamic", (3, 2), 2)])
def test_the_projector_stages_views_are_the_plans(family, mode, grid, batch):
    """The projector stage is a few launches per image, so its views are a third of its host time and the plan prices
    them (reference_plan.PROJECTOR_VIEWS, LAYOUT_VIEWS): per call and per image, tiled or not, as dispatched."""
    from dsocr_core.registry import FAMILIES

    model = synthetic_model(FAMILIES[family].preset("tiny"), seed=0, dtype="bfloat16")
    with torch.no_grad():
        comparisons = compare_workload(model, PLAN, mode, grid, batch)
    projector = [c for c in comparisons if c.stage == "projector"]
    assert [c.group for c in projector] == ["projector"]
    assert projector[0].planned.views == projector[0].metadata > 0


def test_the_host_parts_benchmark_runs_on_the_cpu(tmp_path):
    """benchmarks/reference_host_parts.py as a smoke test (the tiny model, one point): every stage's event and host
    times, its op counts, the projector's two parts with and without the timer's wait, and their ops' host time."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reference_host_parts.py"
    spec = importlib.util.spec_from_file_location("reference_host_parts", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "parts.json"
    assert bench.main(["--device", "cpu", "--preset", "tiny", "--points", "tiny,1x1,8,2", "--repeats", "1",
                       "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    (point,) = d["points"]
    assert point["ops"]["projector"]["launch"] == 2 + 2 * 2 and point["ops"]["projector"]["metadata"] == 6 + 5 * 2
    for key in ("event_s", "host_s"):
        assert all(point[key][s] > 0 for s in bench.STAGES)
    for parts in point["projector_parts"].values():
        assert len(parts["event_s"]) == len(parts["host_s"]) == 2 and min(parts["host_s"]) > 0
    assert len(point["projector_part_ops"]) == 2 and "aten::cat" in point["projector_part_ops"][1]
    assert set(d["after_sync_op_s"]) == {"steady", "after_sync", "after_busy_sync"}
    assert d["layout_call_s"]["one image's layout (layout_image, 1x1)"] > 0
