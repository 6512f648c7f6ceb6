"""benchmarks/grouped_gemm_steps.py, benchmarks/routing_loads_cpu.py and benchmarks/moe_rows.py on the CPU: the
step curve's pieces and the tile model that reads it, the loads a prefill records, the MoE rows' steps."""
import json

import pytest

from benchmark_scripts import load_benchmark


def test_the_steps_benchmark_times_both_gemms_at_each_size(tmp_path):
    out = tmp_path / "gg.json"
    assert load_benchmark("grouped_gemm_steps").main(["--device", "cpu", "--quick", "--rows", "8,16", "--repeats",
                                                      "1", "--out", str(out)]) == 0
    points = json.loads(out.read_text())["points"]
    assert [p["rows"] for p in points] == [8, 16]
    assert all(p["gate_up_eager_s"] > 0 and p["down_eager_s"] > 0 for p in points)


def test_the_tile_model_charges_each_group_its_whole_tiles():
    steps = {"experts": 64, "points": [{"rows": r, "gate_up_graph_s": 64 * t, "down_graph_s": 0.0}
                                       for r, t in ((128, 1.0), (256, 2.0), (512, 3.0))]}
    cost = load_benchmark("routing_loads_cpu").step_cost(steps)
    assert cost(0) == 0.0 and cost(128) == pytest.approx(1.0)
    assert cost(129) == pytest.approx(2.0) and cost(256) == pytest.approx(2.0)  # one whole tile
    assert cost(257) == pytest.approx(3.0)  # two tiles: 512 rows' time
    assert cost(1024) == pytest.approx(6.0)  # beyond the curve: in proportion to its last point


def test_a_quick_run_records_each_moe_layer_calls_loads(tmp_path):
    out = tmp_path / "loads.json"
    assert load_benchmark("routing_loads_cpu").main(["--quick", "--out", str(out)]) == 0
    calls = json.loads(out.read_text())["calls"]
    assert calls
    for tokens, distinct, loads in calls:
        assert len(loads) == distinct and loads == sorted(loads, reverse=True) and sum(loads) > tokens


def test_the_moe_rows_benchmark_times_and_checks_each_step(tmp_path):
    """benchmarks/moe_rows.py on the CPU: torch's eager formulation of the grouping, the copy and the combine at
    each token count and skew, checked against itself (the Triton kernels and the compiled variants need a GPU)."""
    out = tmp_path / "rows.json"
    assert load_benchmark("moe_rows").main(["--device", "cpu", "--quick", "--tokens", "5,40", "--skews", "0,1.2",
                                            "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["skew"], r["tokens"], r["step"]) for r in rows} == {
        (s, t, step) for s in (0.0, 1.2) for t in (5, 40) for step in ("group", "scatter", "combine")}
    assert all(r["seconds"] > 0 and r["max_abs_diff"] == 0 for r in rows)
