"""benchmarks/vision_kernels.py on the CPU: the tiny model's fast engine, the prefill's stages of two pages
timed and listed op by op under torch.profiler, beside the time model's prediction from the shipped H100
profile. No timing thresholds (a CPU's times say nothing about a GPU's): every stage of every point is timed,
its ops attributed, and the predicted column is the time model's own figure for the same workload."""
import json
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "data/profiles/h100.json"


def _script():
    return load_benchmark("vision_kernels")


def test_points_are_parsed_and_bad_ones_named():
    vk = _script()
    assert vk.parse_point("gundam:3x2:b4") == {"mode": "gundam", "grid": (3, 2), "batch": 4, "text_tokens": 10}
    assert vk.parse_point("base") == {"mode": "base", "grid": (1, 1), "batch": 1, "text_tokens": 10}
    assert vk.parse_point("tiny:1x1:b4:t78") == {"mode": "tiny", "grid": (1, 1), "batch": 4, "text_tokens": 78}
    assert vk.parse_point("gundam:2x2:t500")["text_tokens"] == 500
    for bad in ("gundam:3by2", "gundam:3x2:4", "gundam:3x2:b4:x", "tiny:1x1:t3:b2", "tiny:1x1:b0", "tiny:1x1:b2:b3"):
        with pytest.raises(Exception, match="mode:WxH"):
            vk.parse_point(bad)
    with pytest.raises(Exception, match="unknown mode 'nonsense'"):  # a usage error, not a traceback later
        vk.parse_point("nonsense:1x1")
    assert vk.parse_stages("sam,prefill") == ("sam", "prefill")
    with pytest.raises(Exception, match="comma list"):
        vk.parse_stages("sam,decode")


def test_each_stage_is_timed_listed_and_predicted(tmp_path):
    vk = _script()
    out = tmp_path / "vk.json"
    assert vk.main(["--device", "cpu", "--quick", "--points", "gundam:2x1,small:1x1:b2:t40", "--repeats", "1",
                    "--stages", ",".join(vk.STAGES), "--profile", str(PROFILE), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["stages"] == list(vk.STAGES) == ["sam", "clip", "projector", "prefill"]
    assert [(p["mode"], p["batch"], p["text_tokens"]) for p in result["points"]] == [("gundam", 1, 10),
                                                                                     ("small", 2, 40)]
    for p in result["points"]:
        point = {"mode": p["mode"], "grid": tuple(p["grid"]), "batch": p["batch"], "text_tokens": p["text_tokens"]}
        expected = vk.predicted(str(PROFILE), point, "tiny", "float32")
        assert p["predicted_s"] == pytest.approx(expected)
        for stage in vk.STAGES:
            assert p["measured_s"][stage] > 0
            ops = p["kernels"][stage]
            # the stage's linear layers ran inside it (with a bias: addmm; the LM's have none: mm)
            assert any(k["kernel"] in ("aten::addmm", "aten::mm") for k in ops)
            assert all(k["launches"] > 0 and k["us"] >= 0 for k in ops)
            # the predicted rows of a stage add up to its predicted time
            assert sum(p["predicted_rows"][stage].values()) == pytest.approx(p["predicted_s"][stage], rel=1e-9)
    # the text length reaches the prefill: 40 text tokens a page cost more than 10 in the prediction
    assert result["points"][1]["predicted_s"]["prefill"] > vk.predicted(
        str(PROFILE), {"mode": "small", "grid": (1, 1), "batch": 2, "text_tokens": 10}, "tiny", "float32")["prefill"]


def test_graphed_stages_whose_kernels_the_profiler_did_not_tie_are_named(tmp_path, monkeypatch, capsys):
    """--graphed-kernels: a stage with no kernels tied to it in the graphed run (every stage of an H100 run of
    2026-11-28: the profiler tied no replayed kernel to a stage range) says so instead of printing nothing; a stage
    with kernels lists them."""
    vk = _script()
    real = vk.stage_kernels
    calls = []

    def graphed_empty(session, inputs, passes, stages=vk.STAGES):  # the graphed session's listing comes back empty
        calls.append(session)
        out = real(session, inputs, passes, stages)
        return out if session.engine_options.get("graphs") is False else {s: [] for s in out}

    monkeypatch.setattr(vk, "stage_kernels", graphed_empty)
    out = tmp_path / "vk.json"
    assert vk.main(["--device", "cpu", "--quick", "--points", "small:1x1", "--repeats", "1", "--stages",
                    "projector", "--graphed-kernels", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert len(calls) == 2  # the eager listing and the graphed one
    assert "graphed: no kernels were tied to this stage in the graphed run" in printed
    assert json.loads(out.read_text())["points"][0]["kernels_graphed"] == {"projector": []}
    monkeypatch.setattr(vk, "stage_kernels", real)
    assert vk.main(["--device", "cpu", "--quick", "--points", "small:1x1", "--repeats", "1", "--stages",
                    "projector", "--graphed-kernels", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "   graphed " in printed and "no kernels were tied" not in printed
