"""benchmarks/moe_prefill_groups.py: the three group layouts it times keep every row of a layer, and on the CPU
(the tiny model) it records one grouped call per MoE layer of an eager prefill and times each layout."""
import json

import pytest
import torch

from benchmark_scripts import load_benchmark



def _script():
    return load_benchmark("moe_prefill_groups")


def test_the_plans_groups_and_the_even_groups_keep_the_rows():
    mg = _script()
    counts = torch.tensor([0, 9, 0, 1, 5, 0, 7, 7])  # 6 routed experts, then 2 shared slots
    plan = mg.plan_counts(counts, 6)
    assert plan.tolist() == [5, 5, 5, 0, 0, 0, 7, 7]  # 3 touched experts, 15 rows: the mean each
    even = mg.uniform_counts(counts, 6)
    assert even.tolist() == [3, 3, 3, 2, 2, 2, 7, 7]
    for layout in (plan, even):
        assert int(layout.sum()) == int(counts.sum())


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_each_moe_layer_is_recorded_and_timed(tmp_path):
    mg = _script()
    out = tmp_path / "mg.json"
    assert mg.main(["--device", "cpu", "--quick", "--points", "tiny:1x1:b2:t20", "--repeats", "1",
                    "--out", str(out)]) == 0
    point = json.loads(out.read_text())["points"][0]
    from dsocr_core.registry import get_family
    spec = get_family(None).presets["tiny"]()
    assert len(point["layers"]) == spec.num_hidden_layers - spec.first_k_dense_replace
    for layer in point["layers"]:
        assert 1 <= layer["touched"] <= spec.n_routed_experts
        assert layer["max_rows"] >= layer["mean_rows"] > 0
        assert min(layer["router_s"], layer["plan_s"], layer["uniform_s"]) > 0
    assert point["router_s"] == pytest.approx(sum(layer["router_s"] for layer in point["layers"]))
