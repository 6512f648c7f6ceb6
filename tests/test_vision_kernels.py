"""benchmarks/vision_kernels.py on the CPU: the tiny model's fast engine, CLIP and the projector of two pages
timed and listed op by op under torch.profiler, beside the time model's prediction from the shipped H100
profile. No timing thresholds (a CPU's times say nothing about a GPU's): every stage of every point is timed,
its ops attributed, and the predicted column is the time model's own figure for the same workload."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "data/profiles/h100.json"


def _script():
    spec = importlib.util.spec_from_file_location("vision_kernels", ROOT / "benchmarks" / "vision_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_points_are_parsed_and_bad_ones_named():
    vk = _script()
    assert vk.parse_point("gundam:3x2:b4") == {"mode": "gundam", "grid": (3, 2), "batch": 4}
    assert vk.parse_point("base") == {"mode": "base", "grid": (1, 1), "batch": 1}
    for bad in ("gundam:3by2", "gundam:3x2:4", "gundam:3x2:b4:x"):
        with pytest.raises(Exception, match="mode:WxH"):
            vk.parse_point(bad)


def test_each_stage_is_timed_listed_and_predicted(tmp_path):
    vk = _script()
    out = tmp_path / "vk.json"
    assert vk.main(["--device", "cpu", "--quick", "--points", "gundam:2x1,small:1x1:b2", "--repeats", "1",
                    "--profile", str(PROFILE), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(p["mode"], p["batch"]) for p in result["points"]] == [("gundam", 1), ("small", 2)]
    for p in result["points"]:
        expected = vk.predicted(str(PROFILE), {"mode": p["mode"], "grid": tuple(p["grid"]), "batch": p["batch"]},
                                "tiny", "float32")
        assert p["predicted_s"] == pytest.approx(expected)
        for stage in vk.STAGES:
            assert p["measured_s"][stage] > 0
            ops = p["kernels"][stage]
            assert any(k["kernel"] == "aten::addmm" for k in ops)  # the stage's linear layers ran inside it
            assert all(k["launches"] > 0 and k["us"] >= 0 for k in ops)
