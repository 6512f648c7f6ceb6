"""benchmarks/plan_vs_trace.py on the CPU: the tiny model through the reference engine under torch.profiler, each
aten op's time attributed to the analytic row whose module issued it, beside the reference plan and the predicted
time of the same rows (dsocr_core/measure/row_trace.py). No timing thresholds: the CPU's times only show that
every row was reached and that the attribution adds up; the planned launches must be op_count's, the same plan
priced at the same routing."""
import json
from pathlib import Path

import pytest
import torch

from benchmark_scripts import load_benchmark
from dsocr_core.model import synthetic_model
from dsocr_core.runtime.op_count import compare_workload
from dsocr_core.runtime.reference_plan import ReferenceOptions, ReferencePlan
from dsocr_core.spec import tiny_spec

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2
ARGS = ["--device", "cpu", "--preset", "tiny", "--mode", "tiny", "--grid", "1x1", "--batch", "1",
        "--text-tokens", "10", "--decode-steps", str(STEPS), "--profile", str(ROOT / "data/profiles/h100.json")]


def _script():
    return load_benchmark("plan_vs_trace")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("pvt") / "pvt.json"
    assert _script().main([*ARGS, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _stages(result) -> dict[str, dict]:
    return {st["stage"]: st for st in result["stages"]}


def test_json_has_every_stage_and_the_environment(result):
    assert {"sam", "clip", "projector", "prefill", "first_token", "decode"} <= set(_stages(result))
    assert result["environment"]["torch"] == torch.__version__
    assert result["measured_as"] == "aten ops' self CPU time"
    assert "sam.block.global" in result["table"]


def test_every_planned_row_was_measured(result):
    """Each group the plan prices ran (positive time, kernels); each planned row kind is listed under its group."""
    for st in result["stages"]:
        for g in st["groups"]:
            members = {m["row"] for m in g["members"]}
            if g["planned_launches"]:
                assert g["measured_ms"] > 0 and g["kernels"] > 0, (st["stage"], g["group"])
                assert g["top_kernels"], (st["stage"], g["group"])
                assert "predicted_device_ms" in g and g["predicted_device_ms"] > 0, (st["stage"], g["group"])
            assert members, (st["stage"], g["group"])
        assert st["total_ms"] > 0, st["stage"]


def test_rows_add_up_to_no_more_than_the_stage(result):
    """The stage total is summed over the stage ranges' subtrees, apart from the rows: no work is counted twice."""
    for st in result["stages"]:
        groups = sum(g["measured_ms"] for g in st["groups"])
        assert st["rows_ms"] <= st["total_ms"] + 1e-6, st["stage"]
        assert groups == pytest.approx(st["rows_ms"] + st["outside_ms"], rel=1e-9, abs=1e-9), st["stage"]
        assert groups <= st["total_ms"] * (1 + 1e-9) + 1e-6, st["stage"]


def test_planned_launches_are_op_counts(result):
    """The same plan, rows and routing as runtime/op_count.compare_workload (one decode step: times the steps)."""
    model = synthetic_model(tiny_spec(), seed=0, dtype="bfloat16")
    with torch.no_grad():
        counted = compare_workload(model, ReferencePlan(ReferenceOptions(), "cuda"), "tiny", (1, 1), 1, 10)
    ours = {(st["stage"], g["group"]): g["planned_launches"] for st in result["stages"] for g in st["groups"]}
    for c in counted:
        steps = STEPS if c.stage == "decode" else 1
        assert ours.get((c.stage, c.group), 0.0) == pytest.approx(steps * c.planned.launches), (c.stage, c.group)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_refuses_cuda_without_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        _script().main(["--device", "cuda", "--out", str(tmp_path / "x.json")])
